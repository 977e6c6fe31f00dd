"""``StrandsWorkflow`` under the batch runner: a cancelled rollout is recorded, never scored, never retried.

Real Strands agent and tool, Qwen's real tokenizer and Qwen3's shipped template, a scripted token
policy; the tool cancels its agent's run (``agent.cancel()``, as a caller or Strands' ``stop`` tool would).
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import ToolContext, tool

from rllm.errors import ConfigurationError
from rllm.eval.reports import search_report
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.rewards.base import RewardOutput
from rllm.types import TerminationReason
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'


def _cancelling_lookup(after_current_tools: bool) -> Any:
    @tool(context=True)
    def lookup(key: str, tool_context: ToolContext) -> str:
        """Look a key up."""
        tool_context.agent.cancel(after_current_tools=after_current_tools)
        return f"{key} holds 7"

    return lookup


@pytest.mark.parametrize("after_current_tools", [False, True])
async def test_a_cancelled_rollout_is_recorded_unscored_and_not_retried(after_current_tools: bool) -> None:
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(),
                                 lambda prompt: "\\boxed{7}" if "<tool_response>" in prompt else CALL)
    scored: list[str] = []

    def reward(task: dict[str, Any], answer: str) -> RewardOutput:
        scored.append(answer)
        return RewardOutput(reward=0.0, is_correct=False)

    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"tools": [_cancelling_lookup(after_current_tools)], "system_prompt": "Answer in \\boxed{}.",
                          "reward_fn": reward},
        engine, n_parallel_tasks=1, retry_limit=2, retry_backoff=0.0, progress=False)
    [episode] = await runner.execute_tasks([{"id": "t", "question": "What does alpha hold?"}])

    assert len(engine.prompts) == 1  # the run stopped after the tool round
    assert episode.termination_reason is TerminationReason.CANCELLED
    assert scored == [] and episode.reward == 0.0 and not episode.is_correct  # never scored
    assert episode.info["attempts"] == 1 and episode.info["error"] == "cancelled"  # not retried, reason kept
    assert len(episode.trajectories[0].steps) == 1  # what it did is kept
    stats = runner.stats
    assert stats.cancelled == 1 and stats.scored == 0 and stats.infrastructure_failures == 0
    report = search_report([episode])
    assert report["scored"] == 0 and report["cancelled"] == 1 and report["infrastructure_failures"] == 0


async def test_a_users_own_agent_from_a_factory_is_evaluated_with_every_sample_kept() -> None:
    # The user's factory: a plain strands.Agent with Strands' default sliding window, long tool results.
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"{key} holds 7. " + " ".join(f"w{i}" for i in range(60))

    def factory(model: Any, task: dict[str, Any]) -> Agent:
        built.append(task["id"])
        return Agent(model=model, tools=[lookup], system_prompt="Answer in \\boxed{}.", callback_handler=None,
                     conversation_manager=SlidingWindowConversationManager())

    calls: list[int] = []

    def policy(prompt: str) -> str:
        calls.append(1)
        return CALL if len(calls) % 6 else "\\boxed{7}"  # five lookups, then the answer

    built: list[str] = []
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), policy, context_length=700)
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": factory,
                          "reward_fn": lambda task, answer: RewardOutput(reward=float(answer == "\\boxed{7}"),
                                                                         is_correct=answer == "\\boxed{7}")},
        engine, n_parallel_tasks=1, retry_limit=1, retry_backoff=0.0, progress=False)
    [episode] = await runner.execute_tasks([{"id": "t", "question": "What does alpha hold?"}])

    assert built == ["t"]
    assert episode.termination_reason is TerminationReason.FINISHED and episode.reward == 1.0
    assert len(episode.trajectories) >= 2  # the overflow was trimmed: the rollout went on in a new sample
    assert [t.info["sample"] for t in episode.trajectories] == list(range(len(episode.trajectories)))
    assert all(t.token_trace is not None and t.reward == 1.0 for t in episode.trajectories)
    assert sum(len(t.steps) for t in episode.trajectories) == 6 and episode.metrics["tool_calls"] == 5
    assert episode.metrics["samples"] == len(episode.trajectories)


async def test_a_factory_that_hands_back_the_previous_tasks_agent_stops_the_run_naming_it() -> None:
    # An agent keeps its conversation: the second task would start inside the first one's. A misconfiguration,
    # never scored: the run stops on it (max_same_errors=1) with the factory named.
    from strands import Agent

    from rllm.errors import SystemicFailureError

    kept: list[Agent] = []

    def factory(model: Any, task: dict[str, Any]) -> Agent:
        if not kept:
            kept.append(Agent(model=model, system_prompt="Answer in \\boxed{}.", callback_handler=None))
        return kept[0]

    scored: list[str] = []
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), lambda prompt: "\\boxed{7}")
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": factory,
                          "reward_fn": lambda task, answer: scored.append(answer) or RewardOutput(reward=1.0,
                                                                                          is_correct=True)},
        engine, n_parallel_tasks=1, retry_limit=0, retry_backoff=0.0, max_same_errors=1, progress=False)
    with pytest.raises(SystemicFailureError, match="StrandsWorkflow: agent_factory: agent 'Strands Agents' was "
                                                   "recorded for an earlier rollout"):
        await runner.execute_tasks([{"id": f"t{i}", "question": "What does alpha hold?"} for i in range(2)])
    assert scored == ["\\boxed{7}"]  # the first task only


def test_a_workflow_takes_tools_or_an_agent_factory_not_both() -> None:
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), lambda prompt: "ok")
    with pytest.raises(ConfigurationError, match="either tools"):
        StrandsWorkflow(engine, tools=[], agent_factory=lambda model, task: None, reward_fn=None)
    with pytest.raises(ConfigurationError, match="either tools"):
        StrandsWorkflow(engine, reward_fn=None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tools": [], "agent_factory": lambda model, task: None},
     "exactly one; got both: set either tools or agent_factory"),
    ({}, "exactly one; got neither: set either tools or agent_factory"),
    ({"agent_factory": lambda model, task: None, "system_prompt": "Be brief."},
     "system_prompt does not apply with agent_factory"),
    ({"agent_factory": lambda model, task: None, "agent_kwargs": {"name": "a"}},
     "agent_kwargs does not apply with agent_factory"),
    ({"tools": [], "trace_store": "traces.db"}, "drop trace_store or pass agent_factory"),
], ids=["both", "neither", "prompt_with_factory", "agent_kwargs_with_factory", "trace_store_with_tools"])
def test_the_agent_choice_is_refused_naming_the_argument_and_the_fix(kwargs: dict[str, Any], message: str) -> None:
    """The one rule (``check_agent_choice``) every door applies, seen through the workflow's door."""
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), lambda prompt: "ok")
    with pytest.raises(ConfigurationError, match=r"^StrandsWorkflow: ") as caught:
        StrandsWorkflow(engine, reward_fn=None, **kwargs)
    assert message in str(caught.value)
