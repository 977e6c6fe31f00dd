"""``TransformersEngine.abort``: a request in flight leaves the batch with what it sampled, the rest go on unchanged.

What a verl rollout backend serving this engine needs for ``abort_all_requests``, and what a
cancelled rollout needs so its row and KV cache are not held for the others. The reference is the
same engine sampling each request alone (``max_batch_size=1``), greedy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from rllm.engine.rollout.token_engine import TokenOutput
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.offline.tiny_models import build_tiny_qwen3, build_tiny_tokenizer

GREEDY = {"temperature": 0.0}
LONG, SHORT = 400, 30


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread: on a busy 2-core machine more only slow the tiny model down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer()
    return tokenizer, build_tiny_qwen3(tokenizer)


def _prompts(tokenizer: Any) -> list[list[int]]:
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. What is the capital of France? " * 4)
    return [ids[:20], ids[:9]]


async def _until(condition: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.005)


async def _alone(model: Any, tokenizer: Any, prompt: list[int], max_new: int) -> TokenOutput:
    engine = TransformersEngine(model, tokenizer, max_batch_size=1)
    return await engine._generate(prompt, max_new, GREEDY, engine.new_session())


async def test_abort_hands_back_what_was_sampled_and_the_other_request_is_unchanged(tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    long_prompt, short_prompt = _prompts(tokenizer)
    reference_long = await _alone(model, tokenizer, long_prompt, LONG)
    reference_short = await _alone(model, tokenizer, short_prompt, SHORT)
    assert reference_long.finish_reason == "length"  # it would run to its budget

    engine = TransformersEngine(model, tokenizer, max_batch_size=2)
    session = engine.new_session()
    long_call = asyncio.create_task(engine._generate(long_prompt, LONG, GREEDY, session))
    await _until(lambda: engine.stats.decode_steps >= 3)
    short_call = asyncio.create_task(engine._generate(short_prompt, SHORT, GREEDY, engine.new_session()))
    await _until(lambda: engine.stats.joined >= 1)  # both decode together now
    assert engine.abort(session.request_id) == 1
    aborted, short = await asyncio.wait_for(long_call, 30), await asyncio.wait_for(short_call, 30)

    assert aborted.finish_reason == "abort"
    assert 0 < len(aborted.token_ids) < LONG
    assert aborted.token_ids == reference_long.token_ids[: len(aborted.token_ids)]
    assert aborted.logprobs == pytest.approx(reference_long.logprobs[: len(aborted.token_ids)], abs=1e-4)
    assert short.token_ids == reference_short.token_ids and short.finish_reason == reference_short.finish_reason
    assert short.logprobs == pytest.approx(reference_short.logprobs, abs=1e-4)
    assert engine.stats.aborted == 1
    assert engine.abort(session.request_id) == 0  # nothing of that rollout is in flight any more


async def test_abort_without_a_request_id_stops_everything_in_flight(tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    engine = TransformersEngine(model, tokenizer, max_batch_size=1)  # one decodes, one waits for the row
    calls = [asyncio.create_task(engine._generate(p, LONG, GREEDY, engine.new_session())) for p in _prompts(tokenizer)]
    await _until(lambda: engine.stats.decode_steps >= 3)

    assert engine.abort() == 2
    outputs = await asyncio.wait_for(asyncio.gather(*calls), 30)

    assert [o.finish_reason for o in outputs] == ["abort", "abort"]
    assert all(len(o.token_ids) < LONG for o in outputs)
    assert engine.stats.aborted == 2 and engine.stats.sampled_tokens < LONG
