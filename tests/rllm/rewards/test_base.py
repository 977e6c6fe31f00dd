"""``score_answer``: what a user's reward function may return, and what is refused naming the function and task."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from rllm.errors import ConfigurationError
from rllm.rewards.base import RewardOutput, score_answer

TASK = {"id": "q-7", "question": "What is the capital of France?"}


def _score(result: Any, task: dict[str, Any] = TASK) -> RewardOutput:
    def reward_fn(task: dict[str, Any], final_answer: str) -> Any:
        return result

    return asyncio.run(score_answer(reward_fn, task, "Paris"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_a_non_finite_reward_bare_or_in_a_reward_output_is_refused_naming_the_task(bad: Any) -> None:
    for result in (bad, RewardOutput(reward=bad, is_correct=True)):
        with pytest.raises(ConfigurationError) as caught:
            _score(result)
        message = str(caught.value)
        assert "reward_fn returned" in message and "it returns a RewardOutput or a finite number" in message
        assert "(scoring task id='q-7')" in message


def test_a_task_without_an_id_is_named_by_its_fields() -> None:
    with pytest.raises(ConfigurationError, match=r"scoring the task \{'question': 'What is the capital of Peru\?'\}"):
        _score(RewardOutput(reward=float("nan"), is_correct=False), {"question": "What is the capital of Peru?"})


def test_finite_numbers_of_any_kind_and_reward_outputs_pass_unchanged() -> None:
    output = RewardOutput(reward=0.5, is_correct=False, metadata={"why": "partial"})
    assert _score(output) is output
    assert _score(np.float32(0.25)) == RewardOutput(reward=0.25, is_correct=True)
    assert _score(0) == RewardOutput(reward=0.0, is_correct=False)
    with pytest.raises(ConfigurationError, match="returned True"):
        _score(True)  # a bool is not a reward
