"""``record(agent)``: a user's own Strands ``Agent`` recorded and classified as a ``StrandsAgent`` is.

Plain ``strands.Agent`` objects, unchanged, over a scripted token policy on Qwen3's shipped template.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent, tool

from rllm.errors import ConfigurationError, ToolBackendError
from rllm.integrations.strands import Budget, RLLMModel, record
from rllm.integrations.strands.rollout import run_rollout
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.types import TerminationReason

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
ECHO_CALL = CALL.replace('"lookup"', '"echo_lookup"')


@tool
def echo_lookup(key: str) -> str:
    """Look a key up."""
    return key


def agent_with(tokenizer: Any, lookup: Any) -> tuple[ScriptedTokenEngine, Agent]:
    engine = ScriptedTokenEngine(tokenizer, lambda p: "\\boxed{7}" if "<tool_response>" in p else CALL)
    return engine, Agent(model=RLLMModel(engine), tools=[lookup], name="solver", callback_handler=None)


async def test_a_plain_agent_is_recorded_exactly(tokenizer) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"{key} holds 7"

    engine, agent = agent_with(tokenizer, lookup)
    recorder = record(agent)

    finished = await run_rollout(agent, "What does alpha hold?", recorder=recorder)

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "\\boxed{7}"
    [trajectory] = recorder.trajectories
    assert trajectory.name == "solver" and len(trajectory.steps) == 2
    assert trajectory.steps[0].observation[0]["content"] == "alpha holds 7"
    trace = trajectory.token_trace
    assert trace is not None and trace.token_ids[: len(engine.prompts[1])] == engine.prompts[1]
    assert finished.samples[0]["prompt_ids"] == engine.prompts[0]


async def test_an_agent_recorded_for_an_earlier_rollout_is_refused_before_it_runs_again(tokenizer) -> None:
    # A factory handing back the agent it built for the last task: the agent still holds that conversation,
    # and a second recorder would take every call the first one takes.
    from rllm.integrations.strands import StrandsAgent

    engine, agent = agent_with(tokenizer, echo_lookup)
    await run_rollout(agent, "What does alpha hold?", recorder=record(agent))
    with pytest.raises(TypeError, match="agent 'solver' was recorded for an earlier rollout: .* build a new agent"):
        record(agent)
    own = StrandsAgent(model=RLLMModel(engine), tools=[echo_lookup], name="own")
    assert record(own) is own.recorder  # fresh: its own recorder
    await run_rollout(own, "What does alpha hold?")
    with pytest.raises(TypeError, match="agent 'own' was recorded for an earlier rollout"):
        record(own)
    own.reset()
    assert record(own) is own.recorder  # reset: a fresh episode


async def test_a_plain_agent_without_a_recorder_is_refused(tokenizer) -> None:
    _, agent = agent_with(tokenizer, echo_lookup)
    with pytest.raises(TypeError, match="record\\(agent\\)"):
        await run_rollout(agent, "anything")


@pytest.mark.parametrize(("raised", "reason"), [
    (ToolBackendError("index server down"), TerminationReason.TOOL_BACKEND_ERROR),
    (ConfigurationError("the index rejected the token"), TerminationReason.ERROR),
])
async def test_a_plain_agents_tool_failures_are_typed_as_for_strands_agent(tokenizer, raised, reason) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        raise raised

    engine, agent = agent_with(tokenizer, lookup)

    finished = await run_rollout(agent, "What does alpha hold?", recorder=record(agent))

    assert finished.end.reason is reason and len(engine.prompts) == 1  # no generation spent after the failure
    if isinstance(raised, ConfigurationError):
        assert finished.error is raised  # raised from the run, so training stops with its cause


async def test_the_budget_applies_to_a_plain_agent(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, lambda p: ECHO_CALL)
    agent = Agent(model=RLLMModel(engine), tools=[echo_lookup], callback_handler=None)
    recorder = record(agent, budget=Budget(max_tool_calls=2))
    finished = await run_rollout(agent, "loop", recorder=recorder)
    assert finished.end.reason is TerminationReason.TOOL_BUDGET
    assert recorder.budget_hook.tool_calls == 2 and finished.metrics["tool_calls"] == 3  # the third refused
