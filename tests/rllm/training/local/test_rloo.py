"""Local RLOO training: verl's math on the module the engine samples from, rollouts from the real runner.

Real artifacts: Qwen's tokenizer (its first 8,192 ranks, to keep CPU steps short, or the full
vocabulary), Qwen3's shipped chat template, real Strands agents with a real ``@tool``, verl's own
advantage, loss and log-prob functions, and verl's own padding method. Only the model weights are
random (no hub here).
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rllm.agents.lookup import (
    LOOKUP_BUDGET,
    LOOKUP_SYSTEM_PROMPT,
    LookupWorld,
    demonstration_script,
    lookup_tools,
    score_lookup_answer,
)
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.offline.chat_templates import load_chat_template
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.tokens.renderer import content_text
from rllm.training.local import LocalRLOOTrainer, RolloutRequest, default_actor_config, pad_rollouts, run_rollouts

NO_THINK = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)


@pytest.fixture(scope="module")
def world() -> LookupWorld:
    return LookupWorld(size=50, seed=3)


def _rollouts(engine: Any, world: LookupWorld, requests: list[RolloutRequest], response_length: int = 256) -> list[Any]:
    return asyncio.run(run_rollouts(engine, requests, tools=lookup_tools(world), system_prompt=LOOKUP_SYSTEM_PROMPT,
                                    budget=LOOKUP_BUDGET, response_length=response_length))


def test_demonstrations_run_through_the_runner_with_the_real_template(tokenizer, world) -> None:
    task = world.tasks[7]
    outcomes = {}
    for kind in ("two_hops", "one_hop", "no_tool"):
        engine = MessageScriptedEngine(tokenizer, demonstration_script(task, kind, random.Random(0)),
                                       chat_template_kwargs=NO_THINK)
        (rollout,) = _rollouts(engine, world, [RolloutRequest(task.question, task.task_id, {"max_tokens": 64})])
        outcomes[kind] = (rollout.metrics["tool_calls"], score_lookup_answer(rollout.final_answer, task))
        text = tokenizer.decode(rollout.fields["prompt_ids"] + rollout.fields["response_ids"])
        if kind == "two_hops":
            assert f"item {task.item}" in text and f"code {task.code}" in text and "<tool_response>" in text
    assert outcomes == {"two_hops": (2.0, 1.0), "one_hop": (1.0, 0.0), "no_tool": (0.0, 0.0)}


def _question(messages: list[dict[str, Any]]) -> str:
    return content_text(next(m for m in messages if m["role"] == "user")["content"])


def test_padding_matches_verls_own_agent_loop_padding(tokenizer, world) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    rng = random.Random(1)
    tasks = world.tasks[:3]
    requests, scripts = [], {}
    for task, kind in zip(tasks, ("two_hops", "one_hop", "no_tool"), strict=True):
        scripts[task.question] = demonstration_script(task, kind, rng)
        requests.append(RolloutRequest(task.question, task.task_id, {"max_tokens": 64}))
    engine = MessageScriptedEngine(tokenizer, lambda messages: scripts[_question(messages)](messages),
                                   chat_template_kwargs=NO_THINK)
    rollouts = _rollouts(engine, world, requests)
    batch = pad_rollouts([r.fields for r in rollouts], pad_token_id=tokenizer.pad_token_id, prompt_length=260,
                         response_length=140)
    verl = SimpleNamespace(tokenizer=tokenizer)
    for i, rollout in enumerate(rollouts):
        f = rollout.fields
        prompt = AgentLoopWorker._pad_token_ids(verl, f["prompt_ids"], max_length=260, padding_side="left",
                                                return_attention_mask=True)
        response = AgentLoopWorker._pad_token_ids(verl, f["response_ids"], max_length=140, padding_side="right",
                                                  return_attention_mask=True)
        mask = AgentLoopWorker._pad_token_ids(verl, f["response_mask"], max_length=140, padding_side="right",
                                              return_attention_mask=False)
        assert torch.equal(batch.input_ids[i], torch.cat([prompt["input_ids"], response["input_ids"]], dim=1)[0])
        assert torch.equal(batch.attention_mask[i],
                           torch.cat([prompt["attention_mask"], response["attention_mask"]], dim=1)[0])
        assert torch.equal(batch.response_mask[i], (mask["input_ids"] * response["attention_mask"])[0])
    assert batch.response_mask.sum(dim=1).tolist() == [sum(r.fields["response_mask"]) for r in rollouts]


def _answer_group(tokenizer: Any, world: LookupWorld, answers: list[int]) -> tuple[Any, list[float], list[str]]:
    """One group of single-turn answers to one box (``\\boxed{answer}``), scored against its code."""
    task = world.tasks[11]
    rollouts = []
    for answer in answers:
        engine = MessageScriptedEngine(tokenizer, lambda _messages, a=answer: {"content": f"\\boxed{{{a}}}"},
                                       chat_template_kwargs=NO_THINK)
        rollouts += _rollouts(engine, world, [RolloutRequest(task.question, task.task_id, {"max_tokens": 64})])
    rewards = [score_lookup_answer(r.final_answer, task) for r in rollouts]
    return pad_rollouts([r.fields for r in rollouts], pad_token_id=tokenizer.pad_token_id), rewards, [r.group for r in rollouts]


def test_one_rloo_step_raises_the_better_rollouts_and_lowers_the_others(tokenizer, world) -> None:
    torch.manual_seed(0)
    model = build_tiny_qwen3(tokenizer, hidden_size=64, num_layers=2)
    code = world.tasks[11].code
    batch, rewards, groups = _answer_group(tokenizer, world, [code, code, 1234 if code != 1234 else 4321, 9876])
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    # Plain SGD, so the step follows the gradient of verl's loss (Adam's first step is its sign).
    trainer = LocalRLOOTrainer(model, default_actor_config(1, 4, micro_batch_size=2), lr=0.0,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    batch.rollout_log_probs = trainer.log_probs(batch)  # on-policy: the sampler's logprobs are the model's
    before = (trainer.log_probs(batch) * batch.response_mask).sum(dim=1)
    advantages = trainer.advantages(batch, rewards, groups)
    metrics = trainer.step(batch, rewards, groups)
    change = ((trainer.log_probs(batch) * batch.response_mask).sum(dim=1) - before).tolist()
    assert metrics.updates == 1 and metrics.rollout_ratio_max_dev < 1e-5 and metrics.tokens == int(batch.response_mask.sum())
    per_token = advantages.sum(dim=1) / batch.response_mask.sum(dim=1)
    assert [round(float(a), 4) for a in per_token] == [0.6667, 0.6667, -0.6667, -0.6667]
    assert change[0] > 0 and change[1] > 0, change
    assert change[2] < 0 and change[3] < 0, change


def test_a_uniform_group_has_no_gradient(tokenizer, world) -> None:
    model = build_tiny_qwen3(tokenizer, hidden_size=64, num_layers=2)
    batch, _, groups = _answer_group(tokenizer, world, [1111, 2222, 3333, 4444])
    # SGD without weight decay: AdamW's decoupled decay would move the weights with no gradient at all.
    trainer = LocalRLOOTrainer(model, default_actor_config(1, 4), lr=0.0,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    batch.rollout_log_probs = trainer.log_probs(batch)
    weights = [p.detach().clone() for p in model.parameters()]
    metrics = trainer.step(batch, [1.0] * 4, groups)
    assert metrics.advantage_abs_mean == 0.0 and metrics.grad_norm == 0.0
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters(), strict=True))


async def _sampled_rollouts(engine: Any, world: LookupWorld, n: int, seed: int) -> list[Any]:
    task = world.tasks[5]
    requests = [RolloutRequest(task.question, task.task_id, {"temperature": 1.0, "max_tokens": 24, "seed": seed + i})
                for i in range(n)]
    return await run_rollouts(engine, requests, tools=lookup_tools(world), system_prompt=LOOKUP_SYSTEM_PROMPT,
                              budget=LOOKUP_BUDGET, response_length=512)


def test_ratio_is_one_at_the_first_update_on_multi_turn_rollouts_of_the_real_qwen3_template(world) -> None:
    """Sampler and trainer agree on every sampled token of multi-turn rollouts (full Qwen vocabulary)."""
    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"))
    torch.manual_seed(0)
    model = build_tiny_qwen3(tokenizer, hidden_size=64, num_layers=2)
    engine = TransformersEngine(model, tokenizer, chat_template_kwargs=NO_THINK)
    rollouts = asyncio.run(_sampled_rollouts(engine, world, 4, seed=0))
    assert max(r.fields["num_turns"] for r in rollouts) >= 2, "no rollout went past one model call"
    batch = pad_rollouts([r.fields for r in rollouts], pad_token_id=tokenizer.pad_token_id)
    trainer = LocalRLOOTrainer(model, default_actor_config(1, 4, micro_batch_size=2), lr=1e-4)
    metrics = trainer.step(batch, [1.0, 0.0, 0.0, 1.0], [r.group for r in rollouts])
    assert metrics.rollout_ratio_max_dev < 1e-3, metrics
    assert metrics.tokens == sum(sum(r.fields["response_mask"]) for r in rollouts) > 0


def test_the_engine_samples_from_the_updated_weights(tokenizer, world) -> None:
    torch.manual_seed(0)
    model = build_tiny_qwen3(tokenizer, hidden_size=64, num_layers=2)
    engine = TransformersEngine(model, tokenizer, chat_template_kwargs=NO_THINK)
    trainer = LocalRLOOTrainer(model, default_actor_config(1, 4, micro_batch_size=4), lr=3e-3)
    first = asyncio.run(_sampled_rollouts(engine, world, 4, seed=0))
    batch = pad_rollouts([r.fields for r in first], pad_token_id=tokenizer.pad_token_id)
    trainer.step(batch, [1.0, 0.0, 0.0, 0.0], [r.group for r in first])
    # The same seeds after the step: the sampler's logprobs are the updated model's, not the old one's.
    second = asyncio.run(_sampled_rollouts(engine, world, 4, seed=0))
    batch2 = pad_rollouts([r.fields for r in second], pad_token_id=tokenizer.pad_token_id)
    now = trainer.log_probs(batch2)
    mask = batch2.response_mask.bool()
    assert torch.allclose(now[mask], batch2.rollout_log_probs[mask], atol=1e-4)
    old_logprobs = [r.fields["response_logprobs"] for r in first]
    new_logprobs = [r.fields["response_logprobs"] for r in second]
    assert old_logprobs != new_logprobs


def test_the_learning_proof_runs_end_to_end_and_says_why_it_fails(tmp_path) -> None:
    """A proof far too short to learn runs every phase, writes its files, and fails with its reasons."""
    from rllm.proofs.local_trainer import LearningProof, ProofConfig
    from rllm.training.curves import plot_learning_curve

    config = ProofConfig.for_device("cpu", hidden_size=64, num_layers=2, world_size=120, held_out=4, eval_samples=1,
                                    demonstrations=16, warm_steps=2, warm_batch=8, rl_steps=2, prompts_per_step=2,
                                    rollouts_per_prompt=4, eval_every=1, max_tokens=16)
    seen: list[dict[str, Any]] = []
    result = LearningProof(config, on_step=seen.append).run(tmp_path / "metrics.jsonl")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(seen) == 3 and [row["step"] for row in seen] == [0, 1, 2]
    assert {"train_reward", "eval_reward", "tool_calls", "turns", "sampled_tokens", "step_seconds",
            "update/rollout_ratio_max_dev"} <= set(seen[-1])
    assert result.first_ratio_max_dev < config.max_ratio_dev
    assert not result.passed and any("rose by" in failure for failure in result.failures)
    summary = result.summary()
    assert summary["passed"] is False and summary["steps"] == 2 and summary["config"]["hidden_size"] == 64
    plot_learning_curve(result.history, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rollout_that_ends_on_a_tool_backend_failure_raises_instead_of_being_scored(tokenizer, world) -> None:
    """A tool that marks its backend's failure ends the rollout as infrastructure: never a reward of 0."""
    from strands import tool

    from rllm.errors import InfrastructureError, ToolBackendError

    @tool
    def lookup(key: str) -> str:
        """Look up a key."""
        raise ToolBackendError("the lookup backend is down")

    task = world.tasks[3]
    engine = MessageScriptedEngine(tokenizer, demonstration_script(task, "two_hops", random.Random(0)),
                                   chat_template_kwargs=NO_THINK)
    with pytest.raises(InfrastructureError, match="lookup backend is down|infrastructure"):
        asyncio.run(run_rollouts(engine, [RolloutRequest(task.question, task.task_id, {"max_tokens": 64})],
                                 tools=[lookup], system_prompt=LOOKUP_SYSTEM_PROMPT, budget=LOOKUP_BUDGET,
                                 response_length=256))
