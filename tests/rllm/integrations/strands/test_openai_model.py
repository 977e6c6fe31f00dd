"""NonStreamingOpenAIModel: Strands' OpenAIModel that always sends ``stream: false`` and replays the same events."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from fixtures.strands_agents import (
    SYSTEM,
    ToolLog,
    two_tools_then_answer,
)
from strands import Agent, tool
from strands.models.openai import OpenAIModel

from rllm.errors import exception_chain
from rllm.integrations.strands import NonStreamingOpenAIModel, StrandsAgent, termination_reason_for
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.types import TerminationReason


async def test_non_streaming_openai_model_sends_stream_false(serve) -> None:
    server = serve(two_tools_then_answer)
    model = NonStreamingOpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="scripted")
    agent = StrandsAgent(model, tools=ToolLog().tools, system_prompt=SYSTEM)

    result = await agent.invoke_async("what is 2+3?")

    assert "\\boxed{5}" in str(result)
    assert [r["stream"] for r in server.requests] == [False, False]
    assert all("stream_options" not in r for r in server.requests)
    assert len(agent.trajectory.steps) == 2
    assert agent.trajectory.steps[0].model_output.reasoning == "I should add and look up."
    assert [c.name for c in agent.trajectory.steps[0].tool_calls] == ["add", "lookup"]
    assert server.requests[1]["messages"][2]["reasoning_content"] == "I should add and look up."


async def test_non_streaming_event_sequence_matches_streamed_one(serve) -> None:
    reply = ScriptedReply(content="hello there", tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": 2}', id="t1")])
    server = serve([reply, reply])
    messages = [{"role": "user", "content": [{"text": "hi"}]}]
    client_args = {"base_url": server.base_url, "api_key": "x"}

    async def final_message(model: Any) -> Any:
        agent = Agent(model=model, callback_handler=None)
        events = [e async for e in model.stream(messages)]
        del agent
        return events

    unary = await final_message(NonStreamingOpenAIModel(client_args=client_args, model_id="m"))
    streamed = await final_message(OpenAIModel(client_args=client_args, model_id="m"))

    def blocks(events: list[Any]) -> list[Any]:
        return [e for e in events if "contentBlockStart" in e or "messageStop" in e]

    assert server.requests[0]["stream"] is False and server.requests[1]["stream"] is True
    assert blocks(unary)[-1] == blocks(streamed)[-1] == {"messageStop": {"stopReason": "tool_use"}}
    assert [b for b in blocks(unary) if "toolUse" in b.get("contentBlockStart", {}).get("start", {})] == [
        b for b in blocks(streamed) if "toolUse" in b.get("contentBlockStart", {}).get("start", {})]


async def test_a_system_prompt_in_blocks_is_sent_as_one_system_message(serve) -> None:
    server = serve([ScriptedReply(content="ok")])
    model = NonStreamingOpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="m")
    agent = Agent(model=model, system_prompt=[{"text": "A"}, {"text": "B"}], callback_handler=None)

    await agent.invoke_async("hi")

    assert [m for m in server.requests[0]["messages"] if m["role"] == "system"] == [{"role": "system", "content": "A\nB"}]


async def test_a_malformed_call_never_runs_under_a_plain_strands_agent(serve) -> None:
    server = serve([ScriptedReply(tool_calls=[ScriptedToolCall("note", '{"text": "hi', id="bad")]),
                    ScriptedReply(content="ok")])
    ran: list[str] = []

    @tool
    def note(text: str = "nothing") -> str:
        """Write a note down."""
        ran.append(text)
        return "noted"

    model = NonStreamingOpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="m")
    agent = Agent(model=model, tools=[note], callback_handler=None)

    await agent.invoke_async("note something")

    assert ran == []
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["tool_call_id"] == "bad"
    assert tool_message["content"].startswith("Error: invalid arguments for tool 'note': arguments are not valid JSON")


async def test_a_server_error_that_says_too_long_is_not_a_context_overflow(serve) -> None:
    server = serve([ScriptedReply(status=503, error="upstream took too long")])
    model = NonStreamingOpenAIModel(client_args={"base_url": server.base_url, "api_key": "x", "max_retries": 0},
                                    model_id="m")
    agent = StrandsAgent(model)

    with pytest.raises(Exception) as caught:
        await agent.invoke_async("hi")

    assert agent.termination_reason is not TerminationReason.CONTEXT_OVERFLOW
    # A 5xx is the server's failure: infrastructure, masked in training, never a bug that stops the run.
    assert termination_reason_for(caught.value) is TerminationReason.ENGINE_ERROR
    assert any(isinstance(e, openai.InternalServerError) for e in exception_chain(caught.value))


async def test_a_dead_server_is_an_engine_failure_not_a_bug() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    model = NonStreamingOpenAIModel(client_args={"base_url": closed, "api_key": "x", "max_retries": 0}, model_id="m")
    agent = StrandsAgent(model)
    with pytest.raises(Exception) as caught:
        await agent.invoke_async("hi")
    assert termination_reason_for(caught.value) is TerminationReason.ENGINE_ERROR
