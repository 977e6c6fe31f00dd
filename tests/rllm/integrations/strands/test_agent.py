"""StrandsAgent driving a real Strands agent loop: one Step per model call, every entry point, reset,
agents sharing one model, malformed tool calls that never run, and models that record nothing themselves."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fixtures.strands_agents import (
    SYSTEM,
    ToolLog,
    make_agent,
    two_tools_then_answer,
)
from strands.models.openai import OpenAIModel

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import Budget, RLLMModel, StrandsAgent
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.types import TerminationReason, Trajectory


async def test_one_step_per_model_call_with_observations(serve) -> None:
    server = serve(two_tools_then_answer)
    agent = make_agent(server, ToolLog())

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
    agent = make_agent(server, ToolLog())

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
    agent = make_agent(server, ToolLog())

    await agent.invoke_async("go")

    tool_message = server.requests[1]["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_q", "content": 'Error: ann is over quota\n{"used": 11}'}


@pytest.mark.parametrize("entry_point", ["call", "invoke_async", "stream_async"])
async def test_every_entry_point_records_steps(serve, entry_point: str) -> None:
    server = serve(two_tools_then_answer)
    agent = make_agent(server, ToolLog())

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
    pooled = make_agent(server, ToolLog(), budget=Budget(max_model_turns=5))
    await pooled.invoke_async("task A: what is 2+3?")
    pooled.reset()
    server.clear()
    await pooled.invoke_async("task B: what is 2+3?")
    pooled_requests = list(server.requests)
    pooled_trajectory = pooled.trajectory.model_dump(exclude={"steps": {"__all__": {"info"}}})
    pooled_turns = pooled.budget_hook.model_turns

    server.clear()
    fresh = make_agent(server, ToolLog(), budget=Budget(max_model_turns=5))
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
    agent = make_agent(server, tools)

    await agent.invoke_async("try it")

    assert tools.calls == []
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "bad"
    assert tool_message["content"].startswith("Error") and expected in tool_message["content"]
    step = agent.trajectory.steps[0]
    assert step.tool_errors == [{"id": "bad", "name": call.name, "error": tool_message["content"]}]
    assert agent.trajectory.num_tool_errors == 1
    assert step.tool_calls[0].arguments == call.arguments  # the raw text the model wrote


async def test_plain_strands_model_is_recorded_too(serve) -> None:
    server = serve(two_tools_then_answer)
    model = OpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="scripted")
    agent = StrandsAgent(model, tools=ToolLog().tools, system_prompt=SYSTEM)

    await agent.invoke_async("what is 2+3?")

    assert len(agent.trajectory.steps) == 2
    assert agent.trajectory.steps[1].messages[-2]["tool_call_id"].startswith("call_add_")


async def test_an_unparseable_call_is_refused_and_recorded_without_the_validator(serve) -> None:
    server = serve([ScriptedReply(tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": ', id="bad")]),
                    ScriptedReply(content="ok")])
    tools = ToolLog()
    agent = make_agent(server, tools, validate_tool_calls=False)

    await agent.invoke_async("try it")

    assert tools.calls == []
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["content"].startswith("Error: invalid arguments for tool 'add': arguments are not valid JSON")
    assert agent.trajectory.steps[0].tool_errors == [{"id": "bad", "name": "add", "error": tool_message["content"]}]


async def test_a_cancelled_call_of_a_plain_strands_model_records_nothing_sampled(serve) -> None:
    server = serve([ScriptedReply(content="a long answer", delay=1.0)])
    model = OpenAIModel(client_args={"base_url": server.base_url, "api_key": "x"}, model_id="scripted")
    agent = StrandsAgent(model)

    run = asyncio.create_task(agent.invoke_async("hi"))
    while not server.requests:
        await asyncio.sleep(0.01)
    agent.cancel()
    result = await asyncio.wait_for(run, 30)

    assert result.stop_reason == "cancelled"
    [step] = agent.trajectory.steps
    assert step.stop_reason == "cancelled"
    assert step.model_output.text == "" and step.model_output.finish_reason == "cancelled"  # not Strands' placeholder
    assert agent.termination_reason is TerminationReason.CANCELLED
