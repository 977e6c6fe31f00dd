"""The episode budgets (model turns, tool calls, tool iterations) end a real Strands loop cleanly."""

from __future__ import annotations

from fixtures.strands_agents import (
    ToolLog,
    always_add,
    make_agent,
)

from rllm.integrations.strands import Budget
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.types import TerminationReason


async def test_budget_on_model_turns_ends_episode_cleanly(serve) -> None:
    server = serve(always_add)
    tools = ToolLog()
    agent = make_agent(server, tools, budget=Budget(max_model_turns=3))

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
    agent = make_agent(server, tools, budget=Budget(max_tool_calls=1))

    await agent.invoke_async("add twice")

    assert tools.calls == [("add", {"a": 1, "b": 2})]
    assert len(server.requests) == 1  # the episode ends after the tool round
    assert agent.termination_reason is TerminationReason.TOOL_BUDGET
    refused = agent.trajectory.steps[0].observation[1]
    assert refused["tool_call_id"] == "c2" and "budget" in refused["content"]


async def test_budget_on_tool_iterations(serve) -> None:
    server = serve(always_add)
    tools = ToolLog()
    agent = make_agent(server, tools, budget=Budget(max_tool_iterations=2))

    await agent.invoke_async("loop forever")

    assert len(server.requests) == 2 and len(tools.calls) == 2
    assert agent.termination_reason is TerminationReason.TOOL_BUDGET
