"""JSON over HTTP for engines: the engine errors of a failed exchange, and ``JSONClient`` for non-chat endpoints.

Both ``OpenAIEngine`` (``/v1/chat/completions``) and the token engines (SGLang ``/generate``, vLLM
completions) send through ``rllm.transport``: one httpx pool per event loop, a per-request timeout,
and capped, jittered exponential backoff on 429, 5xx, timeouts and connection errors; other 4xx
fail at once. ``engine_error`` turns what failed into the engine errors of ``rllm.errors``, each
naming the URL and the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rllm.engine.rollout.base import mentions_context_overflow
from rllm.errors import (
    ContextLengthExceededError,
    EngineError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
)
from rllm.transport import HTTPFailure, HTTPTransport


def engine_error(failure: HTTPFailure) -> EngineError:
    """Throttled (429 after the retries), unavailable (no answer, 5xx, garbled), context overflow, or rejected."""
    url, cause = failure.url, failure.cause
    if failure.throttled:
        message = f"{url} kept throttling (429) after {failure.attempts} attempts: {cause}"
        return EngineThrottledError(message, url=url, cause=cause)
    if failure.infrastructure:
        return EngineUnavailableError(f"{url} failed after {failure.attempts} attempts: {cause}", url=url, cause=cause)
    if mentions_context_overflow(failure.body):
        return ContextLengthExceededError(f"{url}: context window exceeded: {cause}", url=url, cause=cause)
    return EngineRequestError(f"{url} rejected the request: {cause}", url=url, cause=cause)


@dataclass
class JSONClient:
    """POSTs JSON to ``base_url`` with pooling, timeouts and retries (``rllm.transport``); fails with ``engine_error``.

    Attributes:
        base_url: Server root, e.g. ``http://127.0.0.1:30000``.
        timeout: Seconds per request.
        max_retries: Retries after the first attempt, for retryable failures only.
        backoff_initial: First backoff in seconds (doubles, jittered).
        backoff_max: Cap on one backoff in seconds.
        max_connections: Pool size per event loop.
    """

    base_url: str
    timeout: float = 600.0
    max_retries: int = 5
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    max_connections: int = 1024
    _transport: HTTPTransport = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._transport = HTTPTransport(
            self.base_url, engine_error, timeout=self.timeout, max_retries=self.max_retries,
            backoff_initial=self.backoff_initial, backoff_max=self.backoff_max, max_connections=self.max_connections,
        )

    async def post(self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        """POST and return the JSON answer, retrying infrastructure failures."""
        answer: dict[str, Any] = await self._transport.request_json("POST", path, json=payload, headers=headers)
        return answer
