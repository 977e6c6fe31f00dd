"""The learning proof: a Strands tool agent's held-out reward rises under RLOO, on one machine.

The task is the two-hop lookup (``rllm.agents.lookup``). A small random-init Qwen3 is warm-started
on imperfect demonstrations (by default 35% look up both hops, 40% stop after the box and answer
with the item's number, 25% guess without the tool), whose tokens come from the same runner and incremental
renderer as the
rollouts (a ``MessageScriptedEngine`` plays the teacher). Then RLOO: each step runs
``prompts_per_step`` x ``rollouts_per_prompt`` Strands agents concurrently on the
``TransformersEngine`` that samples from the very module being trained, pads them as verl's agent
loop does, and takes one ``LocalRLOOTrainer`` step (verl's advantage, loss and log-prob
functions). Held-out reward is measured every ``eval_every`` steps on boxes never trained on.

It passes when held-out reward rises by ``min_rise`` or more, ends at ``min_final`` or more, and
the policy ratio at the first update stays within ``max_ratio_dev`` of 1 (the sampler and the
trainer see the same log-probs, so the engine serves the trained weights). A tiny model on a
synthetic task: it proves the path learns, not that the HotpotQA recipe does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rllm.agents.lookup import (
    DEMONSTRATION_KINDS,
    LOOKUP_BUDGET,
    LOOKUP_SYSTEM_PROMPT,
    LookupTask,
    LookupWorld,
    demonstration_script,
    lookup_tools,
    score_lookup_answer,
)
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.errors import ConfigurationError
from rllm.offline.chat_templates import load_chat_template
from rllm.offline.qwen_tokenizer import VOCABS, build_qwen_tokenizer
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.tokens.renderer import content_text
from rllm.training.local.batch import pad_rollouts
from rllm.training.local.rloo import LocalRLOOTrainer, default_actor_config
from rllm.training.local.rollouts import Rollout, RolloutRequest, run_rollouts
from rllm.training.local.warm_start import warm_start

logger = logging.getLogger(__name__)

CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
"""Qwen3's non-thinking mode, as the recipe runs it."""


@dataclass
class ProofConfig:
    """Everything the proof runs with (written into ``summary.json``).

    ``for_device`` gives the defaults: on CUDA the real Qwen tokenizer and template; on CPU the
    same template on Qwen's first 8,192 ranks, so the output layer does not dominate a 2-core run.
    """

    device: str = "cpu"
    seed: int = 0
    vocab: str = "qwen-8k"
    hidden_size: int = 256
    num_layers: int = 2
    world_size: int = 1000
    held_out: int = 64
    eval_samples: int = 2
    """Seeded samples per held-out box at each evaluation."""
    demonstrations: int = 512
    demonstration_mix: tuple[float, float, float] = (0.35, 0.4, 0.25)
    """Shares of the demonstrations that look up both hops, stop after one, and use no tool."""
    warm_steps: int = 250
    warm_batch: int = 32
    warm_lr: float = 1e-3
    rl_steps: int = 50
    prompts_per_step: int = 8
    rollouts_per_prompt: int = 8
    rl_lr: float = 3e-4
    rl_lr_min_ratio: float = 1.0
    """Where the RL learning rate ends, as a share of ``rl_lr``: below 1, a half-cosine from ``rl_lr`` over
    ``rl_steps`` (verl's ``lr_scheduler_type=cosine`` with ``min_lr_ratio``; the local trainer the same curve)."""
    temperature: float = 1.0
    max_tokens: int = 48
    response_length: int = 320
    micro_batch_size: int = 8
    eval_every: int = 5
    min_rise: float = 0.25
    min_final: float = 0.7
    max_ratio_dev: float = 1e-3

    @classmethod
    def for_device(cls, device: str, **overrides: Any) -> ProofConfig:
        """The defaults for ``device`` (``cpu``, ``cuda``, ``cuda:1``), then ``overrides``."""
        base: dict[str, Any] = {"device": device}
        if device.startswith("cuda"):
            base.update(vocab="qwen", micro_batch_size=32)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def reward_failures(self, before: float, after: float) -> list[str]:
        """Why a held-out reward going from ``before`` to ``after`` fails the proof (both trainers' rule)."""
        problems = []
        if after - before < self.min_rise:
            problems.append(f"held-out reward rose by {after - before:.3f}, less than {self.min_rise}")
        if after < self.min_final:
            problems.append(f"held-out reward ended at {after:.3f}, below {self.min_final}")
        return problems


def rl_learning_rate(config: ProofConfig, step: int) -> float:
    """The learning rate of RL step ``step`` (1-based): verl's cosine schedule without warm-up, zero-indexed."""
    if config.rl_lr_min_ratio >= 1.0:
        return config.rl_lr
    progress = (step - 1) / max(1, config.rl_steps)
    floor = config.rl_lr_min_ratio
    return config.rl_lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class ProofResult:
    """What ``run_learning_proof`` found; ``summary()`` is ``summary.json``."""

    config: ProofConfig
    eval_reward_before: float
    eval_reward_after: float
    first_ratio_max_dev: float
    steps: int
    seconds: float
    warm_start_seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """Why the proof failed; empty when it passed."""
        c = self.config
        problems = c.reward_failures(self.eval_reward_before, self.eval_reward_after)
        if self.first_ratio_max_dev > c.max_ratio_dev:
            problems.append(f"policy ratio at the first update deviates from 1 by {self.first_ratio_max_dev:.2e} "
                            f"(> {c.max_ratio_dev}): the trainer does not see the sampler's log-probs")
        return problems

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failures": self.failures,
            "eval_reward_before": self.eval_reward_before,
            "eval_reward_after": self.eval_reward_after,
            "first_ratio_max_dev": self.first_ratio_max_dev,
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "warm_start_seconds": round(self.warm_start_seconds, 1),
            "config": dataclasses.asdict(self.config),
        }


class LearningProof:
    """Builds the model, engine, task and trainer of ``config`` and runs the proof.

    Args:
        config: What to run.
        on_step: Called with each step's metrics (the CLI's progress bar).
    """

    def __init__(self, config: ProofConfig, on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.config = c = config
        self.on_step = on_step
        torch.manual_seed(c.seed)  # the engine draws unseeded samples from torch's generator
        self.rng = random.Random(c.seed)
        if c.vocab not in VOCABS:
            raise ConfigurationError(f"ProofConfig.vocab={c.vocab!r}: unknown; one of {sorted(VOCABS)}")
        self.tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), VOCABS[c.vocab])
        model: Any = build_tiny_qwen3(self.tokenizer, seed=c.seed, hidden_size=c.hidden_size, num_layers=c.num_layers)
        self.model = model.to(c.device)
        self.engine = TransformersEngine(self.model, self.tokenizer, chat_template_kwargs=CHAT_TEMPLATE_KWARGS,
                                         max_batch_size=c.prompts_per_step * c.rollouts_per_prompt)
        self.world = LookupWorld(c.world_size, seed=c.seed)
        self.train_tasks, self.held_out = self.world.split(c.held_out)
        self.tools = lookup_tools(self.world)
        self.trainer = LocalRLOOTrainer(self.model, default_actor_config(c.prompts_per_step, c.rollouts_per_prompt,
                                                                         c.micro_batch_size),
                                        lr=c.warm_lr, temperature=c.temperature)

    # ------------------------------------------------------------------------------------- rollouts
    def _sampling(self, seed: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens}
        if seed is not None:
            params["seed"] = seed
        return params

    def _run(self, engine: Any, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        return asyncio.run(run_rollouts(engine, requests, tools=self.tools, system_prompt=LOOKUP_SYSTEM_PROMPT,
                                        budget=LOOKUP_BUDGET, response_length=self.config.response_length))

    def _score(self, rollouts: Sequence[Rollout], tasks: Sequence[LookupTask]) -> None:
        for rollout, task in zip(rollouts, tasks, strict=True):
            rollout.reward = score_lookup_answer(rollout.final_answer, task)

    def evaluate(self) -> tuple[float, dict[str, float]]:
        """Held-out reward (``eval_samples`` seeded samples per held-out box) and the episodes' tool use."""
        c = self.config
        tasks = [t for t in self.held_out for _ in range(c.eval_samples)]
        requests = [RolloutRequest(t.question, t.task_id, self._sampling(seed=c.seed * 100_003 + t.box * 16 + i % 16))
                    for i, t in enumerate(tasks)]
        rollouts = self._run(self.engine, requests)
        self._score(rollouts, tasks)
        return statistics.fmean(r.reward for r in rollouts), _episode_stats(rollouts)

    # ----------------------------------------------------------------------------------- warm start
    def demonstrations(self) -> list[Rollout]:
        """Teacher rollouts on distinct training boxes, tokenised by the rollouts' own runner and renderer."""
        c = self.config
        if c.demonstrations > len(self.train_tasks):
            raise ConfigurationError(f"ProofConfig.demonstrations={c.demonstrations}: each needs its own training box "
                                     f"and the world has {len(self.train_tasks)}; lower it or raise world_size")
        tasks = self.rng.sample(self.train_tasks, c.demonstrations)
        kinds = self.rng.choices(list(DEMONSTRATION_KINDS), weights=list(c.demonstration_mix), k=len(tasks))
        scripts = {t.question: demonstration_script(t, k, self.rng) for t, k in zip(tasks, kinds, strict=True)}

        def teacher(messages: list[dict[str, Any]]) -> dict[str, Any]:
            question = next(m for m in messages if m.get("role") == "user")["content"]
            return scripts[content_text(question)](messages)

        engine = MessageScriptedEngine(self.tokenizer, teacher, chat_template_kwargs=CHAT_TEMPLATE_KWARGS)
        requests = [RolloutRequest(t.question, t.task_id, {"max_tokens": c.max_tokens}) for t in tasks]
        rollouts = self._run(engine, requests)
        self._score(rollouts, tasks)
        counts = Counter(kinds)
        logger.info("demonstrations: %s; reward %.2f", dict(counts), statistics.fmean(r.reward for r in rollouts))
        return rollouts

    def warm_start(self, demos: Sequence[Rollout]) -> list[float]:
        """Supervised steps on random batches of ``demos`` (``rllm.training.local.warm_start``); the losses.

        The trainer's optimizer takes them, at ``warm_lr``, so RL starts from its moments.
        """
        c = self.config
        return warm_start(self.model, demos, steps=c.warm_steps, batch_size=c.warm_batch, lr=c.warm_lr,
                          seed=self.rng.randrange(2**31), optimizer=self.trainer.optimizer)

    # ------------------------------------------------------------------------------------------ RL
    def rl_step(self, step: int) -> dict[str, Any]:
        """One RLOO step: rollouts on fresh training boxes, rewards, one trainer step; its metrics."""
        c = self.config
        started = time.perf_counter()
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = rl_learning_rate(c, step)
        tasks = self.rng.sample(self.train_tasks, c.prompts_per_step)
        expanded = [t for t in tasks for _ in range(c.rollouts_per_prompt)]
        rollouts = self._run(self.engine, [RolloutRequest(t.question, t.task_id, self._sampling()) for t in expanded])
        self._score(rollouts, expanded)
        rolled = time.perf_counter()
        batch = pad_rollouts([r.fields for r in rollouts], pad_token_id=self.tokenizer.pad_token_id)
        update = self.trainer.step(batch, [r.reward for r in rollouts], [r.group for r in rollouts])
        done = time.perf_counter()
        return {
            "step": step,
            "train_reward": statistics.fmean(r.reward for r in rollouts),
            **_episode_stats(rollouts),
            **{f"update/{k}": v for k, v in dataclasses.asdict(update).items()},
            "rollout_seconds": round(rolled - started, 3),
            "update_seconds": round(done - rolled, 3),
            "step_seconds": round(done - started, 3),
        }

    def run(self, metrics_path: Path | None = None) -> ProofResult:
        """Warm start, then ``rl_steps`` RLOO steps; metrics appended to ``metrics_path`` as JSON lines."""
        c = self.config
        started = time.perf_counter()
        sink = metrics_path.open("w", encoding="utf-8") if metrics_path is not None else None
        try:
            demos = self.demonstrations()
            losses = self.warm_start(demos)
            warm_seconds = time.perf_counter() - started
            before, stats = self.evaluate()
            logger.info("after the warm start (%d steps, %.0fs, final loss %.3f): held-out reward %.3f",
                        c.warm_steps, warm_seconds, losses[-1] if losses else float("nan"), before)
            history = [{"step": 0, "eval_reward": before, **{f"eval_{k}": v for k, v in stats.items()},
                        "warm_start_loss": losses[-1] if losses else None, "seconds": round(warm_seconds, 1)}]
            self._emit(history[-1], sink)
            after, first_dev = before, None
            for step in range(1, c.rl_steps + 1):
                row = self.rl_step(step)
                if first_dev is None:
                    first_dev = row["update/rollout_ratio_max_dev"]
                if step % c.eval_every == 0 or step == c.rl_steps:
                    after, stats = self.evaluate()
                    row.update(eval_reward=after, **{f"eval_{k}": v for k, v in stats.items()})
                row["seconds"] = round(time.perf_counter() - started, 1)
                history.append(row)
                self._emit(row, sink)
        finally:
            if sink is not None:
                sink.close()
        return ProofResult(config=c, eval_reward_before=before, eval_reward_after=after,
                           first_ratio_max_dev=first_dev if first_dev is not None else 0.0, steps=c.rl_steps,
                           seconds=time.perf_counter() - started, warm_start_seconds=warm_seconds, history=history)

    def _emit(self, row: dict[str, Any], sink: Any) -> None:
        if sink is not None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
        if self.on_step is not None:
            self.on_step(row)


def _episode_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-episode means: tool calls, turns, sampled tokens, response tokens (tool results too); the share cut."""
    return {
        "tool_calls": statistics.fmean(r.metrics["tool_calls"] for r in rollouts),
        "turns": statistics.fmean(r.metrics["turns"] for r in rollouts),
        "sampled_tokens": statistics.fmean(r.metrics["completion_tokens"] for r in rollouts),
        "response_tokens": statistics.fmean(len(r.fields["response_ids"]) for r in rollouts),
        "truncated": statistics.fmean(float(r.truncated) for r in rollouts),
    }
