"""``TransformersEngine``'s continuous batching: concurrent requests sample together, and exactly as alone.

The reference is the same engine with ``max_batch_size=1`` (one request at a time). Models are
tiny random-init ``Qwen3ForCausalLM``s on the tiny BPE tokenizer, and one on Qwen's real
tokenizer and Qwen3's chat template; everything runs on CPU in seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rllm.engine.rollout.token_engine import TokenOutput
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.errors import EngineError
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.tiny_models import build_tiny_qwen3, build_tiny_tokenizer

TOLERANCE = 1e-4
SYSTEM = "You are a careful assistant. Answer briefly; look keys up with the lookup tool when a question names one."


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for this module, restored after it.

    The tiny models gain nothing from more, and on a busy 2-core machine OpenMP's waiting
    threads make every forward up to 100x slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tiny BPE tokenizer with the Qwen3-style template."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    """A 2-layer random-init Qwen3 sized to ``tokenizer``."""
    return build_tiny_qwen3(tokenizer)


def _prompts(tokenizer: Any, count: int = 8) -> list[list[int]]:
    """Prompts of different lengths (4 to 53 tokens)."""
    text = "The quick brown fox jumps over the lazy dog. What is the capital of France? " * 4
    ids = tokenizer.encode(text)
    return [ids[i : i + 4 + 7 * i] for i in range(count)]


async def _sample_all(engine: TransformersEngine, prompts: list[list[int]], max_tokens: list[int],
                      sampling: list[dict[str, Any]]) -> list[TokenOutput]:
    return list(await asyncio.gather(*[
        engine._generate(p, m, s, engine.new_session()) for p, m, s in zip(prompts, max_tokens, sampling, strict=True)
    ]))


def _assert_same(batched: list[TokenOutput], serial: list[TokenOutput]) -> None:
    for got, want in zip(batched, serial, strict=True):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.logprobs is not None and want.logprobs is not None
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < TOLERANCE


def _teacher_forced(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """log_softmax of one full forward over prompt + completion, at each completion token."""
    return [allowed[0] for allowed in _teacher_forced_candidates(model, prompt, completion)]


def _teacher_forced_candidates(model: Any, prompt: list[int], completion: list[int],
                               **sampling: Any) -> list[list[float]]:
    """Per completion token, the logprobs a correct engine may report.

    The logits of one full forward are processed by transformers' own logits warpers (the
    reference for what the engine must sample from). Without ``top_p`` that gives one value. With
    it, the nucleus edge is a cumulative sum compared with ``top_p``: a batched, padded forward and
    this single one differ by ~1e-7, enough to move a token sitting on the edge in or out. So the
    nucleus of ``TopPLogitsWarper`` and the ones a single token wider or narrower are the
    candidates (one boundary token of the 1,509-token vocabulary moves a logprob by ~7e-4);
    anything else (no nucleus, the wrong temperature, the wrong order) stays far outside all three.
    """
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    sampled = sampling.get("temperature", 0.0) > 0
    top_p = sampling.get("top_p", 1.0) if sampled else 1.0
    warpers = LogitsProcessorList()
    if sampled:
        warpers.append(TemperatureLogitsWarper(sampling["temperature"]))
        if sampling.get("top_k"):
            warpers.append(TopKLogitsWarper(sampling["top_k"]))
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = model(ids).logits[0].float()
    candidates = []
    for i, token in enumerate(completion):
        row = len(prompt) + i - 1
        scores = warpers(ids[:, : row + 1], logits[row : row + 1])[0]
        if top_p >= 1:
            candidates.append([torch.log_softmax(scores, dim=-1)[token].item()])
            continue
        nucleus = int(torch.isfinite(TopPLogitsWarper(top_p)(ids, scores[None].clone())[0]).sum())
        ranked = torch.sort(scores, descending=True)
        rank = int((ranked.indices == token).nonzero()[0, 0])
        candidates.append([(scores[token] - torch.logsumexp(ranked.values[:size], dim=0)).item()
                           for size in (nucleus - 1, nucleus, nucleus + 1) if rank < size])
    return candidates


def _assert_logprobs_match(model: Any, prompt: list[int], output: TokenOutput, **sampling: Any) -> None:
    """Each reported logprob is within ``TOLERANCE`` of one of its teacher-forced candidates."""
    assert output.logprobs is not None
    candidates = _teacher_forced_candidates(model, prompt, output.token_ids, **sampling)
    assert len(candidates) == len(output.logprobs)
    for position, (got, allowed) in enumerate(zip(output.logprobs, candidates, strict=True)):
        assert allowed, f"token {position} lies outside even the widened nucleus"
        assert min(abs(got - want) for want in allowed) < TOLERANCE, (position, got, allowed)


async def test_greedy_batched_equals_serial(tokenizer: Any, model: Any) -> None:
    """Eight concurrent greedy requests (prompts of 4-53 tokens, 3-38 new tokens) sample as one at a time."""
    prompts = _prompts(tokenizer)
    max_tokens = [3 + 5 * i for i in range(len(prompts))]
    greedy = [{"temperature": 0.0}] * len(prompts)
    serial_engine = TransformersEngine(model, tokenizer, max_batch_size=1)
    batched_engine = TransformersEngine(model, tokenizer)

    serial = await _sample_all(serial_engine, prompts, max_tokens, greedy)
    batched = await _sample_all(batched_engine, prompts, max_tokens, greedy)

    assert [len(o.token_ids) for o in serial] == max_tokens  # the random model never stops here
    _assert_same(batched, serial)
    assert serial_engine.stats.max_batch == 1
    assert batched_engine.stats.max_batch > 4
    assert batched_engine.stats.decode_steps < serial_engine.stats.decode_steps / 3


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 3}])
async def test_a_shared_prompt_prefix_runs_once_and_changes_nothing(tokenizer: Any, model: Any,
                                                                   sampling: dict[str, Any]) -> None:
    """Prompts sharing 40 tokens (one sent twice): the prefix runs once, and every row samples as alone."""
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. What is the capital of France? " * 8)
    common = ids[:40]
    prompts = [common + ids[100 + 10 * i : 101 + 11 * i] for i in range(6)] + [common + ids[100:101]]
    max_tokens = [8 + 2 * i for i in range(len(prompts))]
    serial = await _sample_all(TransformersEngine(model, tokenizer, max_batch_size=1), prompts, max_tokens,
                               [sampling] * len(prompts))
    engine = TransformersEngine(model, tokenizer)
    gate = threading.Event()

    def hold_first_decode(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs["input_ids"].shape[1] == 1:
            gate.wait(timeout=30)

    # A running request's first decode step waits until all the others are queued: they arrive together.
    handle = model.register_forward_pre_hook(hold_first_decode, with_kwargs=True)
    try:
        running = asyncio.create_task(engine._generate(ids[200:230], 5, sampling, engine.new_session()))
        while engine.stats.prefills < 1:
            await asyncio.sleep(0.001)
        tasks = [asyncio.create_task(engine._generate(p, m, sampling, engine.new_session()))
                 for p, m in zip(prompts, max_tokens, strict=True)]
        await asyncio.sleep(0.01)
        gate.set()
        batched = list(await asyncio.gather(*tasks))
        await running
    finally:
        handle.remove()
        gate.set()

    assert engine.stats.prefills == 2 and engine.stats.joined == len(prompts)
    assert engine.stats.shared_prefix_tokens == (len(prompts) - 1) * 40
    _assert_same(batched, serial)
    for prompt, output in zip(prompts, batched, strict=True):
        _assert_logprobs_match(model, prompt, output, **sampling)


async def test_requests_arriving_mid_batch_join_it(tokenizer: Any, model: Any) -> None:
    """Requests sent while one request decodes join its batch, and all sample as one at a time."""
    prompts = _prompts(tokenizer, 4)
    max_tokens = [400, 20, 30, 25]
    greedy = [{"temperature": 0.0}] * 4
    serial = await _sample_all(TransformersEngine(model, tokenizer, max_batch_size=1), prompts, max_tokens, greedy)
    engine = TransformersEngine(model, tokenizer)

    first = asyncio.create_task(engine._generate(prompts[0], max_tokens[0], greedy[0], engine.new_session()))
    while engine.stats.decode_steps < 3:
        await asyncio.sleep(0.001)
    later = await _sample_all(engine, prompts[1:], max_tokens[1:], greedy[1:])
    batched = [await first, *later]

    assert engine.stats.joined == 3
    assert engine.stats.max_batch == 4
    assert 1 < engine.stats.mean_batch < 4
    _assert_same(batched, serial)


async def test_close_waits_for_the_decode_thread_and_the_engine_still_serves(tokenizer: Any, model: Any) -> None:
    """``close()`` returns once the daemon decode thread has stopped (a process may then exit safely)."""
    engine = TransformersEngine(model, tokenizer)
    prompts = _prompts(tokenizer, 2)
    await _sample_all(engine, prompts, [20, 20], [{"temperature": 0.0}] * 2)
    worker = engine._last_worker
    assert worker is not None
    await engine.close()
    assert not worker.is_alive()
    again = await _sample_all(engine, prompts[:1], [5], [{"temperature": 0.0}])
    assert len(again[0].token_ids) <= 5
    await engine.close()
    assert engine._last_worker is not None and not engine._last_worker.is_alive()


async def test_seeded_sampling_is_the_same_batched_and_serial(tokenizer: Any, model: Any) -> None:
    """Each request's seed alone decides its draws: batched equals serial, another seed differs."""
    prompts = _prompts(tokenizer)
    max_tokens = [12] * len(prompts)
    sampling = [{"temperature": 1.0, "seed": 100 + i} for i in range(len(prompts))]
    sampling[3] = {"temperature": 0.7, "top_k": 20, "seed": 5}
    sampling[5] = {"temperature": 1.0, "top_p": 0.9, "seed": 6}
    sampling[6] = {"temperature": 0.0}

    serial = await _sample_all(TransformersEngine(model, tokenizer, max_batch_size=1), prompts, max_tokens, sampling)
    batched = await _sample_all(TransformersEngine(model, tokenizer), prompts, max_tokens, sampling)
    reseeded = [{**s, "seed": s["seed"] + 1000} if "seed" in s else s for s in sampling]
    other = await _sample_all(TransformersEngine(model, tokenizer), prompts, max_tokens, reseeded)

    _assert_same(batched, serial)
    assert sum(a.token_ids != b.token_ids for a, b in zip(other, batched, strict=True)) >= 5  # the seed matters


async def test_each_request_keeps_its_stop_ids_and_max_tokens(tokenizer: Any, model: Any) -> None:
    """A hook makes the stop token win at position 20 only: each row stops where its own sequence reaches it."""
    engine = TransformersEngine(model, tokenizer)
    stop = min(engine.stop_ids)

    def force_stop_at_position_20(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        at_20 = kwargs["position_ids"][:, -1] == 20
        output.logits[:, -1, sorted(engine.stop_ids)] = -1e4
        output.logits[at_20, -1, stop] = 1e4

    ids = _prompts(tokenizer, 8)[7]
    prompts = [ids[:10], ids[:15], ids[:25], ids[:5], ids[:18]]
    max_tokens = [30, 3, 7, 8, 30]
    handle = model.register_forward_hook(force_stop_at_position_20, with_kwargs=True)
    try:
        outputs = await _sample_all(engine, prompts, max_tokens, [{"temperature": 1.0, "seed": i} for i in range(5)])
    finally:
        handle.remove()

    # Position 20 predicts token 21: the 12th new token after a 10-token prompt, the 4th after 18.
    assert [o.finish_reason for o in outputs] == ["stop", "length", "length", "length", "stop"]
    assert [len(o.token_ids) for o in outputs] == [12, 3, 7, 8, 4]
    assert outputs[0].token_ids[-1] == stop and outputs[4].token_ids[-1] == stop
    assert all(stop not in o.token_ids[:-1] for o in outputs)
    assert engine.stats.max_batch == 5


@pytest.mark.parametrize("processing", [{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.6, "top_k": 30},
                                        {"temperature": 1.3, "top_p": 0.8}, {"temperature": 0.8, "top_k": 50, "top_p": 0.9}])
async def test_logprobs_equal_a_teacher_forced_forward(tokenizer: Any, model: Any, processing: dict[str, Any]) -> None:
    """Greedy and plain sampling: the model's log_softmax, which the trainer recomputes; else the processed scores'."""
    prompts = _prompts(tokenizer)
    max_tokens = [6 + 4 * i for i in range(len(prompts))]
    engine = TransformersEngine(model, tokenizer)
    sampling = [{**processing, "seed": i} for i in range(len(prompts))]

    outputs = await _sample_all(engine, prompts, max_tokens, sampling)

    assert engine.stats.max_batch > 4
    for prompt, output in zip(prompts, outputs, strict=True):
        _assert_logprobs_match(model, prompt, output, **processing)


async def test_a_failing_forward_reaches_its_callers_and_the_engine_goes_on(tokenizer: Any, model: Any) -> None:
    """A forward that raises fails its own requests with an ``EngineError``; the engine serves the rest."""
    prompts = _prompts(tokenizer, 3)
    greedy = {"temperature": 0.0}
    serial = await _sample_all(TransformersEngine(model, tokenizer, max_batch_size=1), prompts, [40, 10, 10], [greedy] * 3)
    engine = TransformersEngine(model, tokenizer)
    poison = prompts[1][-1]
    failing = {"all": True}

    def fail(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        input_ids = kwargs["input_ids"]
        if failing["all"] or (input_ids.shape[1] > 1 and bool((input_ids[:, -1] == poison).any())):
            raise RuntimeError("boom")

    handle = model.register_forward_pre_hook(fail, with_kwargs=True)
    try:
        with pytest.raises(EngineError, match="boom") as raised:
            await engine._generate(prompts[0], 40, greedy, engine.new_session())
        assert isinstance(raised.value.__cause__, RuntimeError)

        # Now only the prefill holding the poisoned prompt fails; the batch it was to join runs on.
        failing["all"] = False
        first = asyncio.create_task(engine._generate(prompts[0], 40, greedy, engine.new_session()))
        while engine.stats.decode_steps < 3:
            await asyncio.sleep(0.001)
        with pytest.raises(EngineError, match="prefill"):
            await engine._generate(prompts[1], 10, greedy, engine.new_session())
        third = await engine._generate(prompts[2], 10, greedy, engine.new_session())
        _assert_same([await first, third], [serial[0], serial[2]])
    finally:
        handle.remove()

    assert engine.stats.failed_forwards == 2
    assert engine.stats.joined >= 1
    _assert_same(await _sample_all(engine, prompts, [40, 10, 10], [greedy] * 3), serial)


async def test_real_qwen_template_batched_equals_serial_and_teacher_forcing() -> None:
    """Chat requests through Qwen's real tokenizer and Qwen3's template: batched = serial = teacher forcing."""
    tokenizer = FAMILIES["qwen3"].tokenizer()
    model = build_tiny_qwen3(tokenizer)
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is " + "two plus " * i + "two?"}]
        for i in range(6)
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                               "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]

    async def answer_all(engine: TransformersEngine) -> list[Any]:
        return list(await asyncio.gather(*[
            engine.get_model_response(messages, tools if i % 2 else None, temperature=0.0, max_tokens=5 + 3 * i)
            for i, messages in enumerate(conversations)
        ]))

    serial = await answer_all(TransformersEngine(model, tokenizer, max_batch_size=1))
    engine = TransformersEngine(model, tokenizer)
    batched = await answer_all(engine)

    assert engine.stats.max_batch > 3
    assert len({len(o.prompt_ids) for o in batched}) == len(batched)
    for got, want in zip(batched, serial, strict=True):
        assert got.prompt_ids == want.prompt_ids and got.completion_ids == want.completion_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < TOLERANCE
        expected = _teacher_forced(model, got.prompt_ids, got.completion_ids)
        assert max(abs(a - b) for a, b in zip(got.logprobs, expected, strict=True)) < TOLERANCE
