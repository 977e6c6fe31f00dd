"""``Workflow``: how one task becomes one ``Episode``.

``AgentWorkflowEngine`` keeps a pool of workflow instances and calls ``reset()`` before every
``run()``, so an instance must carry nothing from one task to the next that ``reset()`` does not
clear: a reused instance behaves exactly like a fresh one.
"""

from __future__ import annotations

import abc
from typing import Any

from rllm.engine.rollout.base import RolloutEngine
from rllm.types import Episode, TerminationReason


class Workflow(abc.ABC):
    """Base of all workflows.

    Args:
        rollout_engine: The engine every model call of this workflow goes to.
        **kwargs: Refused: a misspelt workflow argument must fail loudly, not be ignored.
    """

    def __init__(self, rollout_engine: RolloutEngine, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unknown workflow arguments {sorted(kwargs)}")
        self.rollout_engine = rollout_engine

    @abc.abstractmethod
    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        """Run ``task`` to the end and return its episode, whose ``id`` is ``uid``."""

    def reset(self) -> None:  # noqa: B027 - optional hook: a stateless workflow has nothing to reset
        """Return to the freshly built state; called before every ``run()``."""

    def failed_episode(
        self, task: dict[str, Any], uid: str, reason: TerminationReason, error: str | None = None
    ) -> Episode:
        """The episode of a run that raised, hung or was cut off, with whatever it recorded so far.

        The engine calls this when ``run()`` did not return; override it to include partial
        trajectories. The episode is unscored (reward 0, not correct).
        """
        info: dict[str, Any] = {}
        if error is not None:
            info["error"] = error
        return Episode(id=uid, task=task, termination_reason=reason, info=info)
