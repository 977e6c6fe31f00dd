"""The warm start's shared-prefix step: the same log-probs, loss and gradient as the padded batch, in less time.

Real artifacts: Qwen's tokenizer (its first 8,192 ranks), Qwen3's shipped chat template, demonstrations
rendered by the real runner with the lookup agent's real tool; the reference is the local trainer's
padded forward (verl's padding and ``logprobs_from_logits``). Only the weights are random (no hub here).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import torch

from rllm.agents.lookup import LOOKUP_BUDGET, LOOKUP_SYSTEM_PROMPT, LookupWorld, demonstration_script, lookup_tools
from rllm.errors import ConfigurationError
from rllm.offline.chat_templates import load_chat_template
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.tokens.renderer import content_text
from rllm.training.local import LocalRLOOTrainer, RolloutRequest, default_actor_config, pad_rollouts, run_rollouts
from rllm.training.local.warm_start import sampled_log_probs, shared_prefix_length, supervised_step, warm_start

pytestmark = pytest.mark.slow

NO_THINK = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)


def _demonstrations(tokenizer: Any, count: int, system_prompts: tuple[str, ...] = (LOOKUP_SYSTEM_PROMPT,)) -> list:
    world = LookupWorld(size=200, seed=5)
    rng = random.Random(2)
    kinds = ("two_hops", "one_hop", "no_tool")
    scripts = {t.question: demonstration_script(t, kinds[i % 3], rng) for i, t in enumerate(world.tasks[:count])}
    engine = MessageScriptedEngine(
        tokenizer, lambda messages: scripts[content_text(next(m for m in messages if m["role"] == "user")["content"])](
            messages), chat_template_kwargs=NO_THINK)
    demos = []
    for i, task in enumerate(world.tasks[:count]):
        request = RolloutRequest(task.question, task.task_id, {"max_tokens": 64})
        demos += asyncio.run(run_rollouts(engine, [request], tools=lookup_tools(world), budget=LOOKUP_BUDGET,
                                          system_prompt=system_prompts[i % len(system_prompts)], response_length=256))
    return demos


def _padded_sampled_log_probs(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> torch.Tensor:
    """The reference: the local trainer's padded forward, read at the sampled tokens, row by row."""
    trainer = LocalRLOOTrainer(model, default_actor_config(1, len(rows), len(rows)), lr=0.0)
    batch = pad_rollouts(rows, pad_token_id=tokenizer.pad_token_id)
    return trainer._log_probs(batch)[batch.response_mask.bool()]


@pytest.mark.parametrize("system_prompts", [(LOOKUP_SYSTEM_PROMPT,), (LOOKUP_SYSTEM_PROMPT, "Find the code.")],
                         ids=["one-agent", "two-system-prompts"])
def test_shared_prefix_log_probs_and_gradient_equal_the_padded_batchs(tokenizer, system_prompts) -> None:
    demos = _demonstrations(tokenizer, 6, system_prompts)
    rows = [d.fields for d in demos]
    model = build_tiny_qwen3(tokenizer, seed=1, hidden_size=64, num_layers=2)
    prefix = shared_prefix_length([r["prompt_ids"] + r["response_ids"] for r in rows])
    assert (prefix > 150) == (len(system_prompts) == 1)  # the system prompt and tool schema, or only "<|im_start|>"

    shared = sampled_log_probs(model, rows)
    shared.sum().backward()
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    padded = _padded_sampled_log_probs(model, tokenizer, rows)
    padded.sum().backward()

    assert shared.shape == padded.shape == (sum(sum(r["response_mask"]) for r in rows),)
    torch.testing.assert_close(shared, padded, rtol=1e-5, atol=1e-5)
    for got, expected in zip(shared_grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_step_is_the_batchs_token_mean_whatever_the_micro_batch(tokenizer) -> None:
    rows = [d.fields for d in _demonstrations(tokenizer, 5)]
    losses, weights = [], []
    for micro in (5, 2):
        model = build_tiny_qwen3(tokenizer, seed=1, hidden_size=64, num_layers=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses.append(supervised_step(model, optimizer, rows, micro_batch_size=micro, grad_clip=1e9))
        weights.append(model.model.embed_tokens.weight.detach().clone())
    with torch.no_grad():
        expected = -float(_padded_sampled_log_probs(build_tiny_qwen3(tokenizer, seed=1, hidden_size=64, num_layers=2),
                                                    tokenizer, rows).mean())
    assert losses[0] == pytest.approx(expected, rel=1e-5) and losses[1] == pytest.approx(expected, rel=1e-5)
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-4, atol=1e-6)


def test_the_warm_start_learns_the_demonstrations(tokenizer) -> None:
    demos = _demonstrations(tokenizer, 8)
    model = build_tiny_qwen3(tokenizer, seed=0, hidden_size=64, num_layers=2)
    losses = warm_start(model, demos, steps=30, batch_size=8, lr=1e-2, seed=0)
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]


def test_rows_without_sampled_tokens_are_refused(tokenizer) -> None:
    model = build_tiny_qwen3(tokenizer, seed=0, hidden_size=64, num_layers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    row = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "response_mask": [0, 0]}
    with pytest.raises(ConfigurationError, match="no sampled tokens"):
        supervised_step(model, optimizer, [row])
