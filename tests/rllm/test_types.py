"""The rollout records survive a JSON round trip unchanged, and reject malformed input."""

from __future__ import annotations

import pydantic
import pytest

from rllm.types import Episode, ModelOutput, Step, TerminationReason, ToolCall, Trajectory


def _episode() -> Episode:
    output = ModelOutput(
        text="",
        reasoning="think first",
        tool_calls=[ToolCall.from_arguments("c1", "search", '{"query": "Ünïcode ✓", "k": 3}'),
                    ToolCall.from_arguments("c2", "search", '{"query": ')],
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.125, -1e-9],
        finish_reason="tool_calls",
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )
    step = Step(
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "q"}]}],
        tools=[{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
        model_output=output,
        stop_reason="tool_use",
        observation=[{"role": "tool", "tool_call_id": "c1", "content": "r"}],
        tool_errors=[{"id": "c2", "name": "search", "error": "Error: invalid"}],
        reward=0.5,
        info={"nested": {"a": [1, 2.5, None]}},
    )
    trajectory = Trajectory(name="solver", task={"question": "q", "answer": "a"}, steps=[step], reward=1.0)
    return Episode(id="task-1:0", task={"question": "q"}, trajectories=[trajectory], reward=1.0, is_correct=True,
                   termination_reason=TerminationReason.MAX_TURNS, metrics={"turns": 1.0}, info={"k": "v"})


def test_episode_json_round_trip_is_lossless() -> None:
    episode = _episode()
    restored = Episode.model_validate_json(episode.model_dump_json())
    assert restored == episode
    assert restored.termination_reason is TerminationReason.MAX_TURNS
    assert restored.trajectories[0].steps[0].model_output.logprobs == [-0.125, -1e-9]
    assert restored.trajectories[0].num_tool_errors == 1


def test_tool_call_parsing_is_strict() -> None:
    assert ToolCall.from_arguments("a", "f", "").input == {}
    assert ToolCall.from_arguments("a", "f", '{"x": [1]}').input == {"x": [1]}
    assert ToolCall.from_arguments("a", "f", '"text"').error == "arguments must be a JSON object"
    broken = ToolCall.from_arguments("a", "f", "{'x': 1}")
    assert broken.input is None and broken.error.startswith("arguments are not valid JSON")


def test_records_reject_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="completion_id"):
        ModelOutput(completion_id=[1])


def test_infrastructure_failures_are_marked() -> None:
    assert TerminationReason.ENGINE_ERROR.is_infrastructure_failure
    assert TerminationReason.TIMEOUT.is_infrastructure_failure
    assert not TerminationReason.MAX_TURNS.is_infrastructure_failure


def test_only_the_policys_outcomes_are_scored() -> None:
    unscored = {r for r in TerminationReason if not r.is_scored}
    assert unscored == {TerminationReason.ENGINE_ERROR, TerminationReason.TOOL_BACKEND_ERROR,
                        TerminationReason.TIMEOUT, TerminationReason.CANCELLED, TerminationReason.ERROR}
    assert not TerminationReason.CANCELLED.is_infrastructure_failure  # never retried
