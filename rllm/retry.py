"""What every HTTP engine shares: capped, jittered backoff and one connection pool per event loop."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

logger = logging.getLogger(__name__)

T = TypeVar("T")


def backoff_retrying(
    url: str,
    *,
    max_retries: int,
    backoff_initial: float,
    backoff_max: float,
    retryable: Callable[[BaseException], bool],
    describe: Callable[[BaseException], str],
    retry_after: Callable[[BaseException], float | None] | None = None,
) -> AsyncRetrying:
    """Retry ``retryable`` failures ``max_retries`` times, waiting ``backoff_initial * 2**n`` (capped, jittered).

    ``retry_after`` reads a server's requested delay (``Retry-After``) from a failure; the wait is
    then at least that long, still capped at ``backoff_max``.
    """
    backoff = wait_exponential_jitter(multiplier=backoff_initial, max=backoff_max, jitter=backoff_initial)

    def wait(state: RetryCallState) -> float:
        delay = backoff(state)
        error = state.outcome.exception() if state.outcome and retry_after else None
        asked = retry_after(error) if error is not None and retry_after else None
        return min(max(delay, asked), backoff_max) if asked is not None else delay

    return AsyncRetrying(
        stop=stop_after_attempt(max_retries + 1),
        wait=wait,
        retry=retry_if_exception(retryable),
        before_sleep=lambda state: logger.warning(
            "%s: attempt %d failed (%s), retrying",
            url,
            state.attempt_number,
            _describe_outcome(state, describe),
        ),
        reraise=True,
    )


def _describe_outcome(state: RetryCallState, describe: Callable[[BaseException], str]) -> str:
    """The failure of the attempt that just ended, described, or ``"?"`` when there is none."""
    error = state.outcome.exception() if state.outcome else None
    return describe(error) if error is not None else "?"


class PerLoop(Generic[T]):
    """One object per running event loop, made on first use.

    An httpx pool cannot cross event loops, and Strands' synchronous ``Agent.__call__`` runs every
    call on a fresh loop; keying by loop (weakly) keeps one pool per loop and frees it with the loop.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._items: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        """The running loop's object."""
        loop = asyncio.get_running_loop()
        item = self._items.get(loop)
        if item is None:
            item = self._items[loop] = self._factory()
        return item

    def pop(self) -> T | None:
        """Forget and return the running loop's object, if any."""
        return self._items.pop(asyncio.get_running_loop(), None)
