"""JSON over HTTP for engines that are not OpenAI chat endpoints (SGLang ``/generate``, vLLM completions).

One httpx pool per event loop, a per-request timeout, and capped, jittered exponential backoff on
429, 5xx, timeouts and connection errors; other 4xx fail at once. Errors are the engine errors of
``rllm.engine.rollout.base`` and name the URL and the cause.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from rllm.engine.rollout.base import (
    ContextLengthExceededError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
)

logger = logging.getLogger(__name__)

_CONTEXT_PHRASES = ("context length", "maximum context", "too long", "max_model_len", "exceed")


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
    _clients: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            client = httpx.AsyncClient(base_url=self.base_url.rstrip("/"), timeout=self.timeout, limits=limits)
            self._clients[loop] = client
        return client

    async def post(self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        """POST and return the JSON answer, retrying infrastructure failures."""
        url = f"{self.base_url.rstrip('/')}{path}"
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential_jitter(multiplier=self.backoff_initial, max=self.backoff_max, jitter=self.backoff_initial),
            retry=retry_if_exception(_retryable),
            before_sleep=lambda s: logger.warning("%s: attempt %d failed (%s), retrying", url, s.attempt_number,
                                                  _describe(s.outcome.exception()) if s.outcome else "?"),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._client().post(path, json=payload, headers=headers)
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
            if any(phrase in response.text.lower() for phrase in _CONTEXT_PHRASES):
                raise ContextLengthExceededError(f"{url}: context window exceeded: {cause}", url=url, cause=cause)
            raise EngineRequestError(f"{url} rejected the request: {cause}", url=url, cause=cause)
        return response.json()
