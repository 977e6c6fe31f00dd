"""The reward-function protocol every workflow scores answers with."""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rllm.errors import ConfigurationError


@dataclass
class RewardOutput:
    """A scored answer.

    Attributes:
        reward: The scalar the trainer optimises.
        is_correct: Whether the answer counts as right for accuracy (independent of partial credit).
        metadata: How the score came about (extracted answer, match details, why it is zero).
    """

    reward: float
    is_correct: bool
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class RewardFn(Protocol):
    """Scores ``response``, the agent's final answer text (its last assistant message, never tool output)."""

    def __call__(self, task: dict[str, Any], response: str) -> RewardOutput:
        """Score one answer to ``task``."""
        ...


async def score_answer(reward_fn: Any, task: dict[str, Any], final_answer: str) -> RewardOutput:
    """``reward_fn(task, final_answer)`` as a ``RewardOutput``, awaited when it is async.

    A reward function may return a ``RewardOutput`` or a number (``is_correct`` is then ``reward > 0``);
    anything else, and a reward that is not a finite number (NaN or infinite, bare or in the
    ``RewardOutput``), is a ``ConfigurationError`` naming the function and the task: it would be trained
    on as nothing, or turn every advantage of its group into NaN.
    """
    result = reward_fn(task, final_answer)
    if inspect.isawaitable(result):
        result = await result
    reward = result.reward if isinstance(result, RewardOutput) else result
    if _is_finite_number(reward):
        if isinstance(result, RewardOutput):
            return result
        return RewardOutput(reward=float(reward), is_correct=reward > 0)
    name = getattr(reward_fn, "__qualname__", type(reward_fn).__name__)
    returned = f"RewardOutput(reward={reward!r})" if isinstance(result, RewardOutput) else repr(result)
    raise ConfigurationError(f"reward function {name} returned {returned}; it returns a RewardOutput or a finite "
                             f"number (scoring {task_name(task)})")


def task_name(task: Any) -> str:
    """How an error names a task: its ``id`` (a dataset row's ``extra_info.id``), else the task (200 characters)."""
    if isinstance(task, dict) and task.get("id") is not None:
        return f"task id={task['id']!r}"
    info = task.get("extra_info") if isinstance(task, dict) else None
    if isinstance(info, dict) and info.get("id") is not None:  # a dataset row written without a task in it
        return f"task id={info['id']!r} (dataset row {info.get('index')})"
    text = repr(task)
    return f"the task {text if len(text) <= 200 else text[:200] + '...'}"


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
