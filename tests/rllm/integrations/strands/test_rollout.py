"""``run_rollout`` and ``run_built``: the one runner every consumer reads a rollout from.

What a consumer relies on, on a plain ``strands.Agent`` (``record``) over a scripted token policy on
Qwen3's shipped template: a run past its time limit is infrastructure (masked, never raised); a bug
in the run is kept with its cause and raised by ``raise_if_unexpected``; a run that never reached
the model has no samples and says why; responses past ``response_length`` are cut and marked; the
final answer is never a tool round's text; a factory's agent and team go through one entry point.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from strands import Agent, tool
from strands.hooks import BeforeModelCallEvent, HookProvider, HookRegistry
from strands.multiagent import Swarm

from rllm.errors import RolloutWithoutTokensError
from rllm.integrations.strands import Budget, RLLMModel, record
from rllm.integrations.strands.rollout import final_answer_text, run_rollout
from rllm.integrations.strands.teams import record_built, run_built
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.types import TerminationReason

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key} holds 7"


def _answering(tokenizer: Any, answer: str = "\\boxed{7}") -> ScriptedTokenEngine:
    """A policy that looks alpha up, then answers."""
    return ScriptedTokenEngine(tokenizer, lambda prompt: answer if "<tool_response>" in prompt else CALL)


class _Hung(ScriptedTokenEngine):
    """A policy whose server never answers."""

    async def _generate(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3600)


class _Bug(HookProvider):
    """A user's hook with a bug: it raises before the first model call."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeModelCallEvent, self._explode)

    def _explode(self, event: BeforeModelCallEvent) -> None:
        raise KeyError("user_id")


def _agent(engine: Any, **kwargs: Any) -> Agent:
    return Agent(model=RLLMModel(engine), tools=[lookup], name="solver", callback_handler=None, **kwargs)


async def test_a_run_past_its_time_limit_is_infrastructure_masked_and_not_raised(tokenizer) -> None:
    agent = _agent(_Hung(tokenizer, lambda prompt: ""))
    recorder = record(agent)

    finished = await run_rollout(agent, "What does alpha hold?", recorder=recorder, timeout_s=0.2)

    assert finished.end.reason is TerminationReason.TIMEOUT
    assert finished.end.infra_failure and not finished.end.scored and finished.end.final_answer == ""
    assert isinstance(finished.error, TimeoutError)
    finished.raise_if_unexpected()  # infrastructure: the consumer masks it, nothing is raised


async def test_a_bug_in_the_run_is_kept_with_its_cause_and_raised_by_the_consumer(tokenizer) -> None:
    agent = _agent(_answering(tokenizer), hooks=[_Bug()])
    recorder = record(agent)

    finished = await run_rollout(agent, "What does alpha hold?", recorder=recorder)

    assert finished.end.reason is TerminationReason.ERROR and not finished.end.infra_failure
    assert finished.end.failure == "KeyError: 'user_id'"
    with pytest.raises(KeyError, match="user_id") as raised:
        finished.raise_if_unexpected()
    assert raised.value is finished.error  # the run's own exception, not a summary of it
    # It never reached the model: no samples, and asking for them says why instead of training on nothing.
    assert finished.samples == [] and finished.num_model_calls == 0
    with pytest.raises(RolloutWithoutTokensError, match="before its first model call: KeyError") as missing:
        finished.token_samples()
    assert missing.value.__cause__ is finished.error


async def test_a_response_past_response_length_is_cut_there_and_marked_truncated(tokenizer) -> None:
    engine = _answering(tokenizer, answer="The item in alpha holds the number seven, so \\boxed{7}")
    agent = _agent(engine)
    recorder = record(agent)

    whole = await run_rollout(agent, "What does alpha hold?", recorder=recorder)
    [sample] = whole.samples
    full_response = len(sample["response_ids"])
    assert not whole.truncated and whole.end.reason is TerminationReason.FINISHED and whole.num_model_calls == 2

    agent = _agent(_answering(tokenizer, answer="The item in alpha holds the number seven, so \\boxed{7}"))
    recorder = record(agent)
    cut = await run_rollout(agent, "What does alpha hold?", recorder=recorder, response_length=full_response - 5)
    [short] = cut.samples
    assert cut.truncated and len(short["response_ids"]) == full_response - 5
    assert short["response_ids"] == sample["response_ids"][: full_response - 5]  # cut, never re-rendered
    assert len(short["response_mask"]) == len(short["response_logprobs"]) == full_response - 5
    # The agent's run is whole (its answer too); only the exported fields are cut.
    assert cut.end.final_answer == whole.end.final_answer == "The item in alpha holds the number seven, so \\boxed{7}"


async def test_a_run_the_budget_ends_after_a_tool_round_has_no_final_answer(tokenizer) -> None:
    agent = _agent(ScriptedTokenEngine(tokenizer, lambda prompt: CALL))  # a policy that only ever calls the tool
    recorder = record(agent, budget=Budget(max_tool_iterations=1))

    finished = await run_rollout(agent, "What does alpha hold?", recorder=recorder)

    assert finished.end.reason is TerminationReason.TOOL_BUDGET and finished.end.scored
    [trajectory] = finished.trajectories
    assert trajectory.steps[-1].tool_calls and final_answer_text(trajectory) == ""
    assert finished.end.final_answer == ""  # never the tool call's text or Strands' stop notice


async def test_an_agent_and_a_team_from_a_factory_run_through_one_entry_point(tokenizer) -> None:
    agent = _agent(_answering(tokenizer))
    recorders = record_built(agent)
    assert list(recorders) == ["solver"]
    alone = await run_built(agent, "What does alpha hold?", recorders)
    assert alone.end.final_answer == "\\boxed{7}" and [t.name for t in alone.trajectories] == ["solver"]

    team = Swarm([_agent(_answering(tokenizer))])
    team_recorders = record_built(team)
    together = await run_built(team, "What does alpha hold?", team_recorders)
    assert together.end.reason is TerminationReason.FINISHED and together.end.final_answer == "\\boxed{7}"
    assert [t.name for t in together.trajectories] == ["solver"] and together.metrics["nodes"] == 1.0
    assert alone.sample_names == together.sample_names == ["solver"]  # whose sample each verl row is

    with pytest.raises(TypeError, match="not a Strands Agent, Swarm or Graph"):
        record_built(lambda prompt: prompt)  # type: ignore[arg-type]
