"""The learning proof through verl's own trainer: the local proof's task and warm start, then verl's RLOO.

``run_verl_proof`` runs ``rllm.proofs.local_trainer``'s two-hop lookup proof with verl in place of
``LocalRLOOTrainer``: the same model, demonstrations and warm start (``LearningProof.demonstrations``
and ``warm_start``), the warm-started model and tokenizer saved with ``save_pretrained``, the
training and held-out boxes written as verl rows (``rllm.agents.lookup.lookup_verl_rows``), and
then ``python -m rllm.training.verl.train --config-name lookup_rloo`` (``--cpu`` on a CPU): verl's
v1 trainer with the guarded task runner, the embedded ``TransformersEngine`` rollout backend,
``StrandsAgentLoop`` and the lookup scorer. Held-out reward is verl's own validation
(``trainer.val_before_train`` and ``trainer.test_freq``): the ``val-core/lookup/reward/mean@N``
metric its file logger (``VERL_FILE_LOGGER_PATH``) writes.

The settings are the local proof's ``ProofConfig`` mapped onto the recipe (``verl_overrides``).
What verl does differently: a fresh AdamW for RL (the local trainer keeps the warm start's moments),
unseeded held-out samples, and the rollout-vs-actor check on log-probs (``rllm/guard/logprob_gap_max``
of the first step, on the rollouts the gap guard audits) instead of the policy ratio.

It is the one module under ``rllm.training.verl`` that names an agent: the proof's task.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rllm.agents.lookup import DATA_SOURCE, LookupTask, lookup_verl_rows
from rllm.data.verl_rows import write_parquet
from rllm.proofs.local_trainer import LearningProof, ProofConfig

logger = logging.getLogger(__name__)

RECIPE = "lookup_rloo"
"""The shipped recipe (``rllm/training/verl/config/lookup_rloo.yaml``)."""
PROMPT_LENGTH = 512
"""``data.max_prompt_length``: the system prompt, the lookup tool's schema and a question take ~230 tokens."""
VAL_PREFIX = f"val-core/{DATA_SOURCE}/reward/mean@"
"""verl's held-out reward: the mean over every sample of every held-out box (``mean@<val_kwargs.n>``)."""
GAP_METRIC = "rllm/guard/logprob_gap_max"
"""Largest |rollout - actor| log-prob over a step's sampled tokens (``rllm.training.verl.trainer.guards``)."""


@dataclass
class VerlProofResult:
    """What ``run_verl_proof`` found; ``summary()`` is ``summary.json``.

    Attributes:
        eval_reward_before: verl's held-out reward after the warm start (validation at step 0).
        eval_reward_after: verl's held-out reward at the last validation.
        first_logprob_gap_max: ``rllm/guard/logprob_gap_max`` of the first RL step.
        steps: RL steps verl logged.
        seconds: Wall time of the whole proof (warm start, saving, verl).
        warm_start_seconds: Demonstrations and warm start.
        verl_seconds: The verl run, start-up included.
        returncode: The verl run's exit status.
        log_path: Its console output.
        history: Per row: step 0 (held-out reward), then each RL step.
    """

    config: ProofConfig
    eval_reward_before: float
    eval_reward_after: float
    first_logprob_gap_max: float
    steps: int
    seconds: float
    warm_start_seconds: float
    verl_seconds: float
    returncode: int
    log_path: Path
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """Why the proof failed; empty when it passed (the local proof's thresholds)."""
        c, problems = self.config, []
        if self.returncode != 0:
            problems.append(f"verl's trainer exited with status {self.returncode} (its output: {self.log_path})")
        if self.steps < c.rl_steps:
            problems.append(f"verl logged {self.steps} of {c.rl_steps} RL steps")
        if math.isnan(self.eval_reward_before) or math.isnan(self.eval_reward_after):
            problems.append(f"verl logged no held-out reward ({VAL_PREFIX}{c.eval_samples}) before or after training")
            return problems
        problems += c.reward_failures(self.eval_reward_before, self.eval_reward_after)
        if not self.first_logprob_gap_max <= c.max_ratio_dev:
            gap = self.first_logprob_gap_max
            problems.append(f"the rollout's log-probs differ from the actor's by up to {gap:.2e} "
                            f"at the first step (> {c.max_ratio_dev}): the rollout does not serve the trained weights")
        return problems

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, Any]:
        return {
            "trainer": "verl",
            "passed": self.passed,
            "failures": self.failures,
            "eval_reward_before": self.eval_reward_before,
            "eval_reward_after": self.eval_reward_after,
            "first_logprob_gap_max": self.first_logprob_gap_max,
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "warm_start_seconds": round(self.warm_start_seconds, 1),
            "verl_seconds": round(self.verl_seconds, 1),
            "config": asdict(self.config),
        }


def write_lookup_rows(train: Sequence[LookupTask], held_out: Sequence[LookupTask], data_dir: Path) -> tuple[Path, Path]:
    """The training and held-out boxes as verl rows: ``data_dir/train.parquet`` and ``validation.parquet``."""
    return (write_parquet(lookup_verl_rows(train, "train"), data_dir / "train.parquet"),
            write_parquet(lookup_verl_rows(held_out, "validation"), data_dir / "validation.parquet"))


def verl_overrides(config: ProofConfig, model_dir: Path, data_dir: Path, out_dir: Path) -> list[str]:
    """Hydra overrides that set the ``lookup_rloo`` recipe to ``config``, the model and the rows.

    Mapped: boxes per step (``train_batch_size``, one optimizer step per RL step), rollouts per box,
    the RL learning rate and its schedule, temperature (training and validation), samples per held-out box
    (``val_kwargs.n``), response length, tokens per model call, micro-batch, steps, evaluation
    interval, the world the rows come from and the seed (data order). The warm start's settings
    stay in this process.
    """
    return [
        f"actor_rollout_ref.model.path={model_dir.resolve()}",
        f"data.train_files={(data_dir / 'train.parquet').resolve()}",
        f"data.val_files={(data_dir / 'validation.parquet').resolve()}",
        f"data.seed={config.seed}",
        f"data.train_batch_size={config.prompts_per_step}",
        f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={config.response_length}",
        f"actor_rollout_ref.rollout.max_model_len={PROMPT_LENGTH + config.response_length}",
        f"actor_rollout_ref.rollout.n={config.rollouts_per_prompt}",
        f"actor_rollout_ref.rollout.temperature={config.temperature}",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={config.temperature}",
        f"actor_rollout_ref.rollout.val_kwargs.n={config.eval_samples}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={config.micro_batch_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={config.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={config.micro_batch_size}",
        f"actor_rollout_ref.actor.optim.lr={config.rl_lr}",
        *([] if config.rl_lr_min_ratio >= 1.0 else ["actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                                                     f"actor_rollout_ref.actor.optim.min_lr_ratio={config.rl_lr_min_ratio}"]),
        f"rllm.agent_loop.max_tokens_per_turn={config.max_tokens}",
        f"trainer.total_training_steps={config.rl_steps}",
        f"trainer.test_freq={config.eval_every}",
        f"trainer.default_local_dir={(out_dir / 'checkpoints').resolve()}",
        f"rllm.agent_loop.tool_kwargs.world_size={config.world_size}",
        f"rllm.agent_loop.tool_kwargs.seed={config.seed}",
        f"hydra.run.dir={(out_dir / 'hydra').resolve()}",
    ]


def history_row(step: int, data: dict[str, Any]) -> dict[str, Any]:
    """One line of verl's file logger as a row of the local proof's history (what ``plot_learning_curve`` reads)."""
    row: dict[str, Any] = {"step": step}
    held_out = [v for k, v in data.items() if k.startswith(VAL_PREFIX)]
    if held_out:
        row["eval_reward"] = float(held_out[0])
        calls = [v for k, v in data.items() if k.startswith(f"val-aux/{DATA_SOURCE}/tool_calls/mean@")]
        if calls:
            row["eval_tool_calls"] = float(calls[0])
    names = {"train_reward": "critic/score/mean", "tool_calls": "rllm/guard/tool_calls_per_episode",
             "turns": "num_turns/mean", "response_tokens": "response_length/mean", "logprob_gap_max": GAP_METRIC,
             "pg_loss": "actor/pg_loss", "grad_norm": "actor/grad_norm", "step_seconds": "timing_s/step",
             "rollout_seconds": "timing_s/gen", "update_seconds": "timing_s/update_actor",
             "eval_seconds": "timing_s/testing"}
    row.update({name: float(data[key]) for name, key in names.items() if key in data})
    return row


def _read_new_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` after byte ``offset``, and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def run_verl_trainer(overrides: Sequence[str], *, cpu: bool, metrics_path: Path, log_path: Path,
                     on_line: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 2.0) -> int:
    """Run ``python -m rllm.training.verl.train`` on the lookup recipe; its exit status.

    verl runs in its own process (its plugin reads the CPU switch when verl is imported, and Ray
    is started and stopped with it); its console goes to ``log_path``, and each line its file
    logger writes to ``metrics_path`` is handed to ``on_line`` as it appears.
    """
    metrics_path.unlink(missing_ok=True)
    # --config-name last: the launcher puts its own overrides before the ones it is given.
    command = [sys.executable, "-m", "rllm.training.verl.train", *(["--cpu"] if cpu else []), *overrides,
               "--config-name", RECIPE]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_path.resolve())}
    logger.info("verl: %s (output: %s)", " ".join(command), log_path)
    offset = 0
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                done = process.poll() is not None
                lines, offset = _read_new_lines(metrics_path, offset)
                for line in lines:
                    if on_line is not None:
                        on_line(line)
                if done:
                    return int(process.returncode)
                time.sleep(poll_s)
        finally:
            if process.poll() is None:  # interrupted: stop verl (Ray's processes go with its driver)
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()


def prepare_verl_proof(config: ProofConfig, out_dir: Path) -> tuple[LearningProof, list[float], float]:
    """Warm start as the local proof does and write what verl reads; the proof, its losses and the seconds taken.

    Writes ``out_dir/warm_start_model/`` (model and tokenizer, ``save_pretrained``) and ``out_dir/data/``
    (the training and held-out boxes as verl rows). The returned proof holds the warm-started model.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proof = LearningProof(config)
    losses = proof.warm_start(proof.demonstrations())
    model_dir = out_dir / "warm_start_model"
    proof.model.save_pretrained(model_dir)
    proof.tokenizer.save_pretrained(model_dir)
    write_lookup_rows(proof.train_tasks, proof.held_out, out_dir / "data")
    seconds = time.perf_counter() - started
    logger.info("warm start: %d steps, final loss %.3f, %.0fs; saved to %s", config.warm_steps,
                losses[-1] if losses else float("nan"), seconds, model_dir)
    return proof, losses, seconds


def run_verl_proof(config: ProofConfig, out_dir: Path, on_step: Callable[[dict[str, Any]], None] | None = None,
                   overrides: Sequence[str] = (),
                   on_warm_start: Callable[[float], None] | None = None) -> VerlProofResult:
    """Warm start as the local proof does, save the model, write the rows, train and validate with verl.

    ``overrides`` are further Hydra overrides of the recipe, applied after ``verl_overrides``;
    ``on_warm_start`` gets the warm start's seconds before verl's trainer starts. Writes
    ``out_dir/warm_start_model/``, ``out_dir/data/``, ``out_dir/verl_metrics.jsonl`` (verl's file logger),
    ``out_dir/verl.log`` and ``out_dir/metrics.jsonl`` (the rows ``on_step`` gets).
    """
    started = time.perf_counter()
    proof, losses, warm_seconds = prepare_verl_proof(config, out_dir)
    if on_warm_start is not None:
        on_warm_start(warm_seconds)
    del proof  # the verl run loads its own copies; free this one (and its GPU memory)
    gc.collect()
    _empty_device_cache(config.device)

    history: list[dict[str, Any]] = []
    log_path = out_dir / "verl.log"
    with (out_dir / "metrics.jsonl").open("w", encoding="utf-8") as sink:
        def on_line(line: dict[str, Any]) -> None:
            row = history_row(int(line["step"]), line["data"])
            row["seconds"] = round(time.perf_counter() - started, 1)
            if row["step"] == 0:
                row["warm_start_loss"] = losses[-1] if losses else None
            history.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            if on_step is not None:
                on_step(row)

        verl_started = time.perf_counter()
        returncode = run_verl_trainer([*verl_overrides(config, out_dir / "warm_start_model", out_dir / "data", out_dir),
                                       *overrides],
                                      cpu=config.device == "cpu", metrics_path=out_dir / "verl_metrics.jsonl",
                                      log_path=log_path, on_line=on_line)
        verl_seconds = time.perf_counter() - verl_started
    held_out = [(row["step"], row["eval_reward"]) for row in history if "eval_reward" in row]
    before = next((reward for step, reward in held_out if step == 0), math.nan)
    after = held_out[-1][1] if held_out and held_out[-1][0] > 0 else math.nan
    steps = [row for row in history if row["step"] > 0]
    first_gap = steps[0].get("logprob_gap_max", math.nan) if steps else math.nan
    return VerlProofResult(config=config, eval_reward_before=before, eval_reward_after=after,
                           first_logprob_gap_max=first_gap, steps=len(steps),
                           seconds=time.perf_counter() - started, warm_start_seconds=warm_seconds,
                           verl_seconds=verl_seconds, returncode=returncode, log_path=log_path, history=history)


def _empty_device_cache(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
