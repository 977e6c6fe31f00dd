"""Strands' ``cancel_signal`` (``agent.cancel()``) aborts a model call in flight on every engine.

The embedded engine drops the cancelled row from its batch (another rollout waiting for the only
row gets it), the HTTP engines close their request (the server sees the client hang up, which is
what vLLM and SGLang abort on), and the trace gains no sampled segment: the step is recorded as
cancelled, and a later call continues from the last sampled turn. (verl's server client cannot
abort one request, so ``cancel()`` on an agent over ``VerlEngine`` raises:
``tests/rllm/engine/rollout/test_verl_engine.py``.) Real pieces: a tiny random Qwen3 on Qwen's real
tokenizer and template, real Strands agents, real servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fixtures.hanging_server import HangingServer
from strands import Agent, tool

from rllm.engine.rollout import OpenAIEngine
from rllm.engine.rollout.sglang_engine import SGLangEngine
from rllm.engine.rollout.token_engine import TokenOutput, TokenSession
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.engine.rollout.vllm_engine import VLLMEngine
from rllm.integrations.strands import NonStreamingOpenAIModel, RLLMModel, StrandsAgent
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.types import TerminationReason


async def _until(condition: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Any:
    return FAMILIES["qwen3"].tokenizer()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread: on a busy 2-core machine more only slow the tiny model down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


async def test_cancelling_an_agent_mid_generation_frees_its_row_in_the_embedded_engine(
        qwen3_tokenizer: Any, one_torch_thread: None) -> None:
    engine = TransformersEngine(build_tiny_qwen3(qwen3_tokenizer), qwen3_tokenizer, max_batch_size=1, temperature=0.0)
    agent = StrandsAgent(RLLMModel(engine, params={"max_tokens": 1000}), system_prompt="Be brief.")

    run = asyncio.create_task(agent.invoke_async("Tell me a long story."))
    await _until(lambda: engine.stats.decode_steps >= 5)  # sampling, mid-way through its 1000 tokens
    other = asyncio.create_task(engine.get_model_response([{"role": "user", "content": "hi"}], max_tokens=3))
    await asyncio.sleep(0.1)  # another rollout's call, waiting for the only row
    agent.cancel()
    result = await asyncio.wait_for(run, 60)
    answer = await asyncio.wait_for(other, 60)

    assert result.stop_reason == "cancelled"
    trace = agent.trajectory.token_trace
    assert trace is not None and [s.kind for s in trace.segments] == ["prompt"]
    assert trace.to_verl()["response_ids"] == []  # nothing sampled is exported for training
    [step] = agent.trajectory.steps
    assert step.stop_reason == "cancelled"
    assert step.model_output.finish_reason == "cancelled" and step.model_output.completion_ids is None
    assert agent.termination_reason is TerminationReason.CANCELLED
    assert engine.stats.sampled_tokens < 1000  # the cancelled generation never ran to its budget
    assert answer.completion_ids is not None and len(answer.completion_ids) == 3  # it got the freed row
    assert engine.stats.aborted == 1


@pytest.fixture
def hanging_server() -> Iterator[HangingServer]:
    server = HangingServer().start()
    yield server
    server.stop()


def _http_model(kind: str, server: HangingServer, tokenizer: Any) -> Any:
    if kind == "openai":
        return RLLMModel(OpenAIEngine(model="m", base_url=f"{server.root_url}/v1", max_retries=0))
    if kind == "sglang":
        return RLLMModel(SGLangEngine(server.root_url, tokenizer, max_retries=0))
    if kind == "vllm":
        return RLLMModel(VLLMEngine(f"{server.root_url}/v1", "m", tokenizer, max_retries=0))
    return NonStreamingOpenAIModel(client_args={"base_url": f"{server.root_url}/v1", "api_key": "x", "max_retries": 0},
                                   model_id="m")


@pytest.mark.parametrize("kind", ["openai", "sglang", "vllm", "non_streaming_openai"])
async def test_cancelling_an_agent_closes_the_engines_http_request(kind: str, hanging_server: HangingServer,
                                                                   qwen3_tokenizer: Any) -> None:
    agent = Agent(model=_http_model(kind, hanging_server, qwen3_tokenizer), callback_handler=None)

    run = asyncio.create_task(agent.invoke_async("hi"))
    await hanging_server.wait_for_request()
    cancelled_at = time.monotonic()
    agent.cancel()
    result = await asyncio.wait_for(run, 30)
    await _until(lambda: hanging_server.disconnected, timeout=3)

    assert result.stop_reason == "cancelled"
    [(path, hung_up_at)] = hanging_server.disconnected
    assert path == hanging_server.arrived[0][0]
    assert hung_up_at - cancelled_at < 2  # the server held the request for 5 s


class _HangsOnSecondCall(MessageScriptedEngine):
    """A scripted policy whose second call takes 5 s, long enough to be cancelled."""

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        if len(self.prompts) == 1:
            self.prompts.append(list(prompt_ids))
            await asyncio.sleep(5)
            self.prompts.pop()
        return await super()._generate(prompt_ids, max_new_tokens, sampling, session)


async def test_a_call_after_a_cancelled_one_continues_from_the_last_sampled_turn() -> None:
    family = FAMILIES["qwen2_5"]  # keeps every turn as rendered, so a full render is the reference

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"{key} holds 12"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in messages):
            return {"content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "lookup", "arguments": '{"key": "k"}'}}]}
        return {"content": "\\boxed{12}"}

    engine = _HangsOnSecondCall(family.tokenizer(), script, tool_parser=family.tool_parser)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt="Answer in \\boxed{}.")

    run = asyncio.create_task(agent.invoke_async("What does k hold?"))
    await _until(lambda: len(engine.prompts) == 2)  # the second call is sampling
    agent.cancel()
    assert (await asyncio.wait_for(run, 30)).stop_reason == "cancelled"
    await agent.invoke_async("Go on.")

    trace = agent.trajectory.token_trace
    assert [s.kind for s in trace.segments] == ["prompt", "sampled", "context", "sampled"]
    last = agent.trajectory.steps[-1]
    assert any(m["role"] == "assistant" and "Cancelled by user" in str(m.get("content")) for m in last.messages)
    # What the model saw on the call after the cancelled one is exactly the conversation rendered once.
    assert engine.prompts[-1] == engine.renderer.prompt_ids(last.messages, last.tools)
    assert last.model_output.text == "\\boxed{12}"
