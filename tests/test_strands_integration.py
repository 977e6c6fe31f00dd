"""RLLMModel + StrandsAgent driving a real Strands agent loop against a real HTTP server.

Every test runs a real ``strands.Agent`` loop with real ``@tool`` functions; the model behind it
is a scripted OpenAI-compatible server on 127.0.0.1 that records every request it receives.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import Budget, NonStreamingOpenAIModel, RLLMModel, StrandsAgent
from rllm.testing.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.types import TerminationReason, Trajectory

SYSTEM = "You are a careful assistant. Put the final answer in \\boxed{}."

# Keys a chat-completions request may carry; anything else is a leaked keyword.
_REQUEST_KEYS = {"model", "messages", "tools", "tool_choice", "stream", "stream_options", "temperature", "max_tokens",
                 "logprobs", "top_logprobs", "return_token_ids", "top_p", "seed"}


class ToolLog:
    """Real Strands tools that remember how they were called."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers and return the sum."""
            self.calls.append(("add", {"a": a, "b": b}))
            return a + b

        @tool
        def lookup(key: str) -> dict:
            """Look up a key; answers with a text block and a json block."""
            self.calls.append(("lookup", {"key": key}))
            return {"status": "success", "content": [{"text": f"found {key}"}, {"json": {"key": key, "hits": 2}}]}

        @tool
        def explode(reason: str) -> str:
            """Always fails."""
            self.calls.append(("explode", {"reason": reason}))
            raise RuntimeError(f"boom: {reason}")

        @tool
        def quota(user: str) -> dict:
            """Reports failure through the result status rather than an exception."""
            self.calls.append(("quota", {"user": user}))
            return {"status": "error", "content": [{"text": f"{user} is over quota"}, {"json": {"used": 11}}]}

        self.tools = [add, lookup, explode, quota]


def _question(body: dict[str, Any]) -> str:
    user = next(m for m in body["messages"] if m["role"] == "user")
    content = user["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def two_tools_then_answer(body: dict[str, Any]) -> ScriptedReply:
    """Turn 1: two parallel tool calls (ids derived from the question); turn 2: a final answer."""
    tag = str(abs(hash(_question(body))) % 10_000)
    if not any(m["role"] == "tool" for m in body["messages"]):
        return ScriptedReply(
            reasoning_content="I should add and look up.",
            tool_calls=[
                ScriptedToolCall("add", '{"a": 2, "b": 3}', id=f"call_add_{tag}"),
                ScriptedToolCall("lookup", json.dumps({"key": _question(body)}), id=f"call_lookup_{tag}"),
            ],
        )
    return ScriptedReply(content=f"The answer to {_question(body)} is \\boxed{{5}}")


def always_add(body: dict[str, Any]) -> ScriptedReply:
    """Never stops calling tools: one add per turn."""
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return ScriptedReply(tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": 1}', id=f"call_{turn}")])


def _agent(server, tools: ToolLog, **kwargs: Any) -> StrandsAgent:
    engine = OpenAIEngine(model="scripted", base_url=server.base_url, backoff_initial=0.01, backoff_max=0.05)
    return StrandsAgent(RLLMModel(engine, params={"temperature": 0.7}), tools=tools.tools, system_prompt=SYSTEM, **kwargs)


async def test_requests_carry_tool_calls_and_tool_messages_not_prose(serve) -> None:
    server = serve(two_tools_then_answer)
    tools = ToolLog()
    agent = _agent(server, tools)

    result = await agent.invoke_async("what is 2+3?")

    assert "\\boxed{5}" in str(result)
    first, second = server.requests
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": "what is 2+3?"}]},
    ]
    assert [t["function"]["name"] for t in first["tools"]] == ["add", "lookup", "explode", "quota"]
    assert first["tools"][0]["function"]["description"] == "Add two integers and return the sum."
    assert "tool_choice" not in first and "tool_choice" not in second  # never forced

    tag = str(abs(hash("what is 2+3?")) % 10_000)
    assistant, add_result, lookup_result = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert assistant["reasoning_content"] == "I should add and look up."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] == [
        (f"call_add_{tag}", "add", {"a": 2, "b": 3}),
        (f"call_lookup_{tag}", "lookup", {"key": "what is 2+3?"}),
    ]
    assert add_result == {"role": "tool", "tool_call_id": f"call_add_{tag}", "content": "5"}
    assert lookup_result["role"] == "tool" and lookup_result["tool_call_id"] == f"call_lookup_{tag}"
    # Both blocks of the result survive: the text and the json.
    text, data = lookup_result["content"].split("\n", 1)
    assert text == "found what is 2+3?" and json.loads(data) == {"key": "what is 2+3?", "hits": 2}
    assert tools.calls == [("add", {"a": 2, "b": 3}), ("lookup", {"key": "what is 2+3?"})]
    for request in server.requests:
        assert set(request) <= _REQUEST_KEYS, set(request) - _REQUEST_KEYS
        assert request["temperature"] == 0.7


async def test_one_step_per_model_call_with_observations(serve) -> None:
    server = serve(two_tools_then_answer)
    agent = _agent(server, ToolLog())

    await agent.invoke_async("what is 2+3?")

    steps = agent.trajectory.steps
    assert len(steps) == 2
    assert [s.messages for s in steps] == [r["messages"] for r in server.requests]
    assert [c.name for c in steps[0].tool_calls] == ["add", "lookup"]
    assert steps[0].stop_reason == "tool_use" and steps[1].stop_reason == "end_turn"
    assert [o["tool_call_id"] for o in steps[0].observation] == [c.id for c in steps[0].tool_calls]
    assert steps[1].model_output.text.endswith("\\boxed{5}") and steps[1].observation == []
    assert agent.termination_reason is TerminationReason.FINISHED
    assert Trajectory.model_validate_json(agent.trajectory.model_dump_json()) == agent.trajectory


async def test_tool_error_reaches_model_as_error_tool_message(serve) -> None:
    server = serve([
        ScriptedReply(tool_calls=[ScriptedToolCall("explode", '{"reason": "disk full"}', id="call_x")]),
        ScriptedReply(content="sorry"),
    ])
    agent = _agent(server, ToolLog())

    await agent.invoke_async("go")

    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_x"
    assert tool_message["content"].startswith("Error")
    assert "disk full" in tool_message["content"]


async def test_error_status_of_a_tool_result_is_visible(serve) -> None:
    server = serve([
        ScriptedReply(tool_calls=[ScriptedToolCall("quota", '{"user": "ann"}', id="call_q")]),
        ScriptedReply(content="sorry"),
    ])
    agent = _agent(server, ToolLog())

    await agent.invoke_async("go")

    tool_message = server.requests[1]["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_q", "content": 'Error: ann is over quota\n{"used": 11}'}


@pytest.mark.parametrize("entry_point", ["call", "invoke_async", "stream_async"])
async def test_every_entry_point_records_steps(serve, entry_point: str) -> None:
    server = serve(two_tools_then_answer)
    agent = _agent(server, ToolLog())

    if entry_point == "call":
        await asyncio.to_thread(agent, "what is 2+3?")
    elif entry_point == "invoke_async":
        await agent.invoke_async("what is 2+3?")
    else:
        async for _ in agent.stream_async("what is 2+3?"):
            pass

    assert len(agent.trajectory.steps) == 2
    assert [s.messages for s in agent.trajectory.steps] == [r["messages"] for r in server.requests]


async def test_reset_agent_behaves_like_a_fresh_one(serve) -> None:
    server = serve(two_tools_then_answer)
    pooled = _agent(server, ToolLog(), budget=Budget(max_model_turns=5))
    await pooled.invoke_async("task A: what is 2+3?")
    pooled.reset()
    server.clear()
    await pooled.invoke_async("task B: what is 2+3?")
    pooled_requests = list(server.requests)
    pooled_trajectory = pooled.trajectory.model_dump(exclude={"steps": {"__all__": {"info"}}})
    pooled_turns = pooled.budget_hook.model_turns

    server.clear()
    fresh = _agent(server, ToolLog(), budget=Budget(max_model_turns=5))
    await fresh.invoke_async("task B: what is 2+3?")

    assert pooled_requests == server.requests
    assert pooled_trajectory == fresh.trajectory.model_dump(exclude={"steps": {"__all__": {"info"}}})
    def history(agent: StrandsAgent) -> list[Any]:
        return [{k: v for k, v in m.items() if k not in ("tracking_id", "metadata")} for m in agent.messages]

    assert history(pooled) == history(fresh)
    assert pooled_turns == fresh.budget_hook.model_turns == 2
    assert "task A" not in json.dumps(pooled_requests)


async def test_agents_sharing_one_model_record_only_their_own_calls(serve) -> None:
    server = serve(two_tools_then_answer)
    engine = OpenAIEngine(model="scripted", base_url=server.base_url)
    model = RLLMModel(engine)
    agents = [StrandsAgent(model, tools=ToolLog().tools, system_prompt=SYSTEM) for _ in range(4)]
    questions = [f"question {i}" for i in range(4)]

    await asyncio.gather(*(agent.invoke_async(q) for agent, q in zip(agents, questions)))

    for agent, question in zip(agents, questions):
        assert len(agent.trajectory.steps) == 2
        for step in agent.trajectory.steps:
            users = [m for m in step.messages if m["role"] == "user"]
            assert users == [{"role": "user", "content": [{"type": "text", "text": question}]}]
        tag = str(abs(hash(question)) % 10_000)
        assert all(c.id.endswith(tag) for c in agent.trajectory.steps[0].tool_calls)


async def test_budget_on_model_turns_ends_episode_cleanly(serve) -> None:
    server = serve(always_add)
    tools = ToolLog()
    agent = _agent(server, tools, budget=Budget(max_model_turns=3))

    result = await agent.invoke_async("loop forever")

    assert len(server.requests) == 3
    assert len(agent.trajectory.steps) == 3
    assert len(tools.calls) == 3
    assert result.stop_reason == "end_turn"
    assert agent.termination_reason is TerminationReason.MAX_TURNS


async def test_budget_on_tool_calls_refuses_the_extra_call(serve) -> None:
    server = serve([
        ScriptedReply(tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": 2}', id="c1"),
                                  ScriptedToolCall("add", '{"a": 3, "b": 4}', id="c2")]),
        ScriptedReply(content="never asked"),
    ])
    tools = ToolLog()
    agent = _agent(server, tools, budget=Budget(max_tool_calls=1))

    await agent.invoke_async("add twice")

    assert tools.calls == [("add", {"a": 1, "b": 2})]
    assert len(server.requests) == 1  # the episode ends after the tool round
    assert agent.termination_reason is TerminationReason.TOOL_BUDGET
    refused = agent.trajectory.steps[0].observation[1]
    assert refused["tool_call_id"] == "c2" and "budget" in refused["content"]


async def test_budget_on_tool_iterations(serve) -> None:
    server = serve(always_add)
    tools = ToolLog()
    agent = _agent(server, tools, budget=Budget(max_tool_iterations=2))

    await agent.invoke_async("loop forever")

    assert len(server.requests) == 2 and len(tools.calls) == 2
    assert agent.termination_reason is TerminationReason.TOOL_BUDGET


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ScriptedToolCall("add", '{"a": 1, "b": ', id="bad"), "not valid JSON"),
        (ScriptedToolCall("add", "[1, 2]", id="bad"), "must be a JSON object"),
        (ScriptedToolCall("add", '{"a": 1}', id="bad"), "missing required argument(s): b"),
        (ScriptedToolCall("subtract", '{"a": 1, "b": 2}', id="bad"), "unknown tool 'subtract'. Available tools: add, explode, lookup, quota"),
    ],
)
async def test_malformed_tool_calls_never_run(serve, call: ScriptedToolCall, expected: str) -> None:
    server = serve([ScriptedReply(tool_calls=[call]), ScriptedReply(content="ok")])
    tools = ToolLog()
    agent = _agent(server, tools)

    await agent.invoke_async("try it")

    assert tools.calls == []
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "bad"
    assert tool_message["content"].startswith("Error") and expected in tool_message["content"]
    step = agent.trajectory.steps[0]
    assert step.tool_errors == [{"id": "bad", "name": call.name, "error": tool_message["content"]}]
    assert agent.trajectory.num_tool_errors == 1
    assert step.tool_calls[0].arguments == call.arguments  # the raw text the model wrote


async def test_vllm_token_ids_and_logprobs_are_recorded(serve) -> None:
    server = serve([ScriptedReply(content="hi", prompt_token_ids=[1, 2, 3], token_ids=[7, 8], logprobs=[-0.5, -0.25])])
    engine = OpenAIEngine(model="scripted", base_url=server.base_url, return_token_ids=True)
    agent = StrandsAgent(RLLMModel(engine))

    await agent.invoke_async("hello")

    assert server.requests[0]["return_token_ids"] is True and server.requests[0]["logprobs"] is True
    output = agent.trajectory.steps[0].model_output
    assert (output.prompt_ids, output.completion_ids, output.logprobs) == ([1, 2, 3], [7, 8], [-0.5, -0.25])


async def test_context_overflow_and_throttling_map_to_strands_exceptions(serve) -> None:
    overflow = serve([ScriptedReply(status=400, error="This model's maximum context length is 4096 tokens.")])
    agent = StrandsAgent(RLLMModel(OpenAIEngine(model="m", base_url=overflow.base_url)))
    with pytest.raises(ContextWindowOverflowException):
        await agent.invoke_async("long prompt")
    assert agent.termination_reason is TerminationReason.CONTEXT_OVERFLOW
    assert len(overflow.requests) == 1

    throttled = serve([ScriptedReply(status=429, error="slow down")] * 3)
    engine = OpenAIEngine(model="m", base_url=throttled.base_url, max_retries=2, backoff_initial=0.01, backoff_max=0.02)
    agent = StrandsAgent(RLLMModel(engine))
    with pytest.raises(ModelThrottledException):
        await agent.invoke_async("hi")
    assert agent.termination_reason is TerminationReason.ENGINE_ERROR
    assert len(throttled.requests) == 3


async def test_strands_event_sequences(serve) -> None:
    server = serve([
        ScriptedReply(content="plain answer", usage={"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}),
        ScriptedReply(tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": 2}', id="t1")]),
        ScriptedReply(content="cut of", finish_reason="length"),
    ])
    model = RLLMModel(OpenAIEngine(model="m", base_url=server.base_url))
    messages = [{"role": "user", "content": [{"text": "hi"}]}]

    async def kinds() -> list[Any]:
        return [event async for event in model.stream(messages)]

    text = await kinds()
    assert [next(iter(e)) for e in text] == [
        "messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"]
    assert text[2]["contentBlockDelta"]["delta"] == {"text": "plain answer"}
    assert text[4] == {"messageStop": {"stopReason": "end_turn"}}
    assert text[5]["metadata"]["usage"] == {"inputTokens": 11, "outputTokens": 3, "totalTokens": 14}

    tool_use = await kinds()
    assert tool_use[1] == {"contentBlockStart": {"start": {"toolUse": {"name": "add", "toolUseId": "t1"}}}}
    assert tool_use[2] == {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"a": 1, "b": 2}'}}}}
    assert tool_use[4] == {"messageStop": {"stopReason": "tool_use"}}

    truncated = await kinds()
    assert truncated[4] == {"messageStop": {"stopReason": "max_tokens"}}


async def test_tool_choice_is_passed_through_not_forced(serve) -> None:
    server = serve([ScriptedReply(content="a"), ScriptedReply(content="b"), ScriptedReply(content="c")])
    model = RLLMModel(OpenAIEngine(model="m", base_url=server.base_url))
    messages = [{"role": "user", "content": [{"text": "hi"}]}]
    specs = [ToolLog().tools[0].tool_spec]

    for choice in (None, {"auto": {}}, {"tool": {"name": "add"}}):
        async for _ in model.stream(messages, specs, tool_choice=choice):
            pass

    assert [r.get("tool_choice") for r in server.requests] == [
        None, "auto", {"type": "function", "function": {"name": "add"}}]


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


async def test_plain_strands_model_is_recorded_too(serve) -> None:
    server = serve(two_tools_then_answer)
    model = OpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="scripted")
    agent = StrandsAgent(model, tools=ToolLog().tools, system_prompt=SYSTEM)

    await agent.invoke_async("what is 2+3?")

    assert len(agent.trajectory.steps) == 2
    assert agent.trajectory.steps[1].messages[-2]["tool_call_id"].startswith("call_add_")
