"""The reward-function protocol every workflow scores answers with."""

from __future__ import annotations

import inspect
import math
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
    anything else is a ``ConfigurationError`` naming the function: it would be trained on as nothing.
    """
    result = reward_fn(task, final_answer)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, RewardOutput):
        return result
    if isinstance(result, int | float) and not isinstance(result, bool) and math.isfinite(result):
        return RewardOutput(reward=float(result), is_correct=result > 0)
    name = getattr(reward_fn, "__qualname__", type(reward_fn).__name__)
    raise ConfigurationError(f"reward function {name} returned {result!r}; it returns a RewardOutput or a finite "
                             "number")
