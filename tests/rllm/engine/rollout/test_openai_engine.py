"""OpenAIEngine against a real HTTP server: retries, timeouts, errors, parameter filtering."""

from __future__ import annotations

import asyncio
import socket

import pytest

from rllm.engine.rollout import OpenAIEngine
from rllm.errors import (
    ContextLengthExceededError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
)
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall

MESSAGES = [{"role": "user", "content": "hi"}]


def _engine(server, **kwargs) -> OpenAIEngine:
    kwargs.setdefault("backoff_initial", 0.01)
    kwargs.setdefault("backoff_max", 0.05)
    return OpenAIEngine(model="scripted", base_url=server.base_url, **kwargs)


async def test_retries_5xx_and_429_then_succeeds(serve) -> None:
    server = serve([ScriptedReply(status=500, error="oops"), ScriptedReply(status=429, error="slow"),
                    ScriptedReply(status=503, error="down"), ScriptedReply(content="finally")])

    output = await _engine(server).get_model_response(MESSAGES)

    assert output.text == "finally"
    assert len(server.requests) == 4


async def test_timeout_is_retried(serve) -> None:
    server = serve([ScriptedReply(content="late", delay=2.0), ScriptedReply(content="fast")])

    output = await _engine(server, timeout=0.3).get_model_response(MESSAGES)

    assert output.text == "fast"
    assert len(server.requests) == 2


async def test_other_4xx_is_not_retried(serve) -> None:
    server = serve([ScriptedReply(status=400, error="bad tool schema"), ScriptedReply(content="never")])

    with pytest.raises(EngineRequestError) as caught:
        await _engine(server).get_model_response(MESSAGES)

    assert len(server.requests) == 1
    assert server.base_url in str(caught.value) and "bad tool schema" in str(caught.value)


async def test_context_overflow_is_its_own_error(serve) -> None:
    server = serve([ScriptedReply(status=400, error="maximum context length is 32768 tokens")])

    with pytest.raises(ContextLengthExceededError):
        await _engine(server).get_model_response(MESSAGES)
    assert len(server.requests) == 1


async def test_gives_up_with_an_error_naming_url_and_cause(serve) -> None:
    server = serve(lambda body: ScriptedReply(status=502, error="bad gateway"))

    with pytest.raises(EngineUnavailableError) as caught:
        await _engine(server, max_retries=2).get_model_response(MESSAGES)

    message = str(caught.value)
    assert len(server.requests) == 3
    assert f"{server.base_url}/chat/completions" in message
    assert "3 attempts" in message and "HTTP 502" in message and "bad gateway" in message


async def test_persistent_throttling_is_reported_as_throttling(serve) -> None:
    server = serve(lambda body: ScriptedReply(status=429, error="rate limited"))

    with pytest.raises(EngineThrottledError):
        await _engine(server, max_retries=1).get_model_response(MESSAGES)
    assert len(server.requests) == 2


async def test_unreachable_engine_names_the_url() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = OpenAIEngine(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1,
                          backoff_initial=0.01, backoff_max=0.02)

    with pytest.raises(EngineUnavailableError) as caught:
        await engine.get_model_response(MESSAGES)
    assert f"127.0.0.1:{port}" in str(caught.value) and "connection failed" in str(caught.value)


async def test_only_sampling_parameters_reach_the_server(serve) -> None:
    server = serve([ScriptedReply(content="ok")])
    engine = _engine(server, temperature=0.2)

    await engine.get_model_response(
        MESSAGES,
        max_tokens=64,
        top_p=0.9,
        system_prompt_content=[{"text": "x"}],
        tool_execution_handler=object(),
        event_handler=object(),
        invocation_state={"agent": object()},
        agent_metadata=object(),
        cancel_signal=object(),
        model_state={},
        something_new_from_strands=1,
    )

    assert server.requests[0] == {
        "model": "scripted", "messages": MESSAGES, "temperature": 0.2, "max_tokens": 64, "top_p": 0.9}


def test_unknown_default_sampling_parameter_is_rejected() -> None:
    with pytest.raises(TypeError, match="temprature"):
        OpenAIEngine(model="m", base_url="http://127.0.0.1:1/v1", temprature=0.5)


async def test_tool_calls_are_parsed_strictly(serve) -> None:
    server = serve([ScriptedReply(tool_calls=[ScriptedToolCall("f", '{"x": 1}', id="a"),
                                              ScriptedToolCall("g", "{x: 1}", id="b")])])

    output = await _engine(server).get_model_response(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}])

    good, bad = output.tool_calls
    assert (good.input, good.error) == ({"x": 1}, None)
    assert bad.input is None and "not valid JSON" in bad.error and bad.arguments == "{x: 1}"
    assert output.finish_reason == "tool_calls"


async def test_one_pool_per_event_loop(serve) -> None:
    """Strands' sync ``Agent.__call__`` runs each call on a new loop; the engine must survive that."""
    server = serve(lambda body: ScriptedReply(content="ok"))
    engine = _engine(server)

    def in_new_loop() -> str:
        return asyncio.run(engine.get_model_response(MESSAGES)).text

    assert await asyncio.to_thread(in_new_loop) == "ok"
    assert await asyncio.to_thread(in_new_loop) == "ok"
    assert (await engine.get_model_response(MESSAGES)).text == "ok"
