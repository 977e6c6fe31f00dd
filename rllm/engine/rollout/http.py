"""JSON over HTTP for engines that are not OpenAI chat endpoints (SGLang ``/generate``, vLLM completions).

One httpx pool per event loop, a per-request timeout, and capped, jittered exponential backoff on
429, 5xx, timeouts and connection errors; other 4xx fail at once. Errors are the engine errors of
``rllm.engine.rollout.base`` and name the URL and the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from rllm.engine.rollout.base import (
    ContextLengthExceededError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    mentions_context_overflow,
)
from rllm.retry import PerLoop, backoff_retrying


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {response.text[:300]}")
        self.status_code = response.status_code


def _retryable(error: BaseException) -> bool:
    return isinstance(error, (_RetryableStatus, httpx.TransportError))


def _describe(error: BaseException) -> str:
    if isinstance(error, httpx.TimeoutException):
        return "request timed out"
    if isinstance(error, httpx.TransportError):
        return f"connection failed: {error!r}"
    return str(error)


@dataclass
class JSONClient:
    """POSTs JSON to ``base_url`` with pooling, timeouts and retries.

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
    _clients: PerLoop[httpx.AsyncClient] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._clients = PerLoop(self._new_client)

    def _new_client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
        return httpx.AsyncClient(base_url=self.base_url.rstrip("/"), timeout=self.timeout, limits=limits)

    async def post(self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        """POST and return the JSON answer, retrying infrastructure failures."""
        url = f"{self.base_url.rstrip('/')}{path}"
        retrying = backoff_retrying(
            url,
            max_retries=self.max_retries,
            backoff_initial=self.backoff_initial,
            backoff_max=self.backoff_max,
            retryable=_retryable,
            describe=_describe,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._clients.get().post(path, json=payload, headers=headers)
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _RetryableStatus(response)
        except _RetryableStatus as error:
            attempts = f"after {self.max_retries + 1} attempts: {error}"
            if error.status_code == 429:
                raise EngineThrottledError(f"{url} kept throttling {attempts}", url=url, cause=str(error)) from error
            raise EngineUnavailableError(f"{url} failed {attempts}", url=url, cause=str(error)) from error
        except httpx.TransportError as error:
            cause = _describe(error)
            raise EngineUnavailableError(f"{url} failed after {self.max_retries + 1} attempts: {cause}",
                                         url=url, cause=cause) from error
        if response.status_code >= 400:
            cause = f"HTTP {response.status_code}: {response.text[:500]}"
            if mentions_context_overflow(response.text):
                raise ContextLengthExceededError(f"{url}: context window exceeded: {cause}", url=url, cause=cause)
            raise EngineRequestError(f"{url} rejected the request: {cause}", url=url, cause=cause)
        return response.json()
