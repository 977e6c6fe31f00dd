"""Client side of the retrieval service: ``RetrievalClient`` and the Strands ``local_search`` tool.

Needs only the core install (httpx, tenacity, strands). One pooled ``httpx.AsyncClient`` per event
loop; connection failures, timeouts and 502/503/504 are retried with capped, jittered backoff
(a 503's ``Retry-After`` is honoured).

Failures are typed, so whoever runs the agent tells them apart without reading text:

* ``RetrievalUnavailableError`` (a ``ToolBackendError``): unreachable, timed out or 5xx after the
  retries, or a garbled answer. The tool raises it; the model still reads the message as an error
  tool result, and the rollout ends as an infrastructure failure.
* ``RetrievalAuthError`` (a ``ConfigurationError``): 401/403, the token is missing or wrong. The
  tool raises it and the run stops: every search would fail the same way.
* any other 4xx (an empty query, a bad ``top_k``): the policy's doing. The tool returns an error
  result the model reads and can correct.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from rag.errors import RetrievalAuthError, RetrievalError, RetrievalUnavailableError
from rllm.retry import PerLoop, backoff_retrying

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({502, 503, 504})
_AUTH_STATUSES = frozenset({401, 403})
TOKEN_ENV = "RETRIEVAL_TOKEN"
"""The environment variable holding the retrieval server's bearer token, on both sides."""


class _Retryable(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {_detail(response)}")
        self.status = response.status_code
        self.retry_after: float | None
        try:
            self.retry_after = float(response.headers.get("retry-after", ""))
        except ValueError:
            self.retry_after = None


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:300]


def _describe(error: BaseException) -> str:
    if isinstance(error, httpx.ConnectError):
        return "connection refused or host unreachable"
    if isinstance(error, httpx.TimeoutException):
        return "request timed out"
    if isinstance(error, httpx.TransportError):
        return f"connection failed ({type(error).__name__})"
    return str(error)


class RetrievalClient:
    """Talks to ``rag.server``.

    Attributes:
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        token: Bearer token, when the server has one.
        timeout: Seconds per attempt.
        max_retries: Retries after the first attempt (connection errors, timeouts, 502/503/504).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, max_retries: int = 3,
                 *, backoff_initial: float = 0.25, backoff_max: float = 8.0, max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_connections = max_connections
        self._clients: PerLoop[httpx.AsyncClient] = PerLoop(self._new_client)

    def _new_client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
        return httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, limits=limits, headers=headers)

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        retrying = backoff_retrying(
            url, max_retries=self.max_retries, backoff_initial=self.backoff_initial, backoff_max=self.backoff_max,
            retryable=lambda e: isinstance(e, (_Retryable, httpx.TransportError)), describe=_describe,
            retry_after=lambda e: e.retry_after if isinstance(e, _Retryable) else None,
        )
        attempts = self.max_retries + 1
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._clients.get().request(method, path, json=payload)
                    if response.status_code in _RETRY_STATUSES:
                        raise _Retryable(response)
        except _Retryable as e:
            raise RetrievalUnavailableError(f"retrieval server at {self.base_url} is overloaded or unavailable "
                                            f"after {attempts} attempts ({e})", e.status) from e
        except httpx.TransportError as e:
            raise RetrievalUnavailableError(f"retrieval server at {self.base_url} is unreachable after {attempts} "
                                            f"attempts: {_describe(e)}") from e
        status = response.status_code
        if status in _AUTH_STATUSES:
            sent = "a token it does not accept" if self.token else "no token"
            raise RetrievalAuthError(
                f"retrieval server at {self.base_url} rejected the token (HTTP {status}: {_detail(response)}); "
                f"the client sent {sent}: set {TOKEN_ENV} to the token the server was started with", status)
        if status >= 500:
            raise RetrievalUnavailableError(f"retrieval server at {self.base_url} failed (HTTP {status}): "
                                            f"{_detail(response)}", status)
        if status >= 400:
            raise RetrievalError(f"retrieval server rejected the request (HTTP {status}): {_detail(response)}",
                                 status)
        try:
            return response.json()
        except ValueError as e:
            raise RetrievalUnavailableError(f"retrieval server at {url} sent a non-JSON answer") from e

    async def search(self, query: str, top_k: int = 3) -> list[dict[str, Any]]:
        """Top-``top_k`` passages ``{id, title, contents, content, score}``, best first; raises ``RetrievalError``.

        ``contents`` is the text without its title, ``content`` the whole text as the corpus holds it.
        """
        return (await self._request("POST", "/retrieve", {"query": query, "top_k": top_k}))["results"]

    async def search_batch(self, queries: list[str], top_k: int = 3) -> list[list[dict[str, Any]]]:
        """``search`` for several queries in one request; ``result[i]`` answers ``queries[i]``."""
        return (await self._request("POST", "/batch_retrieve", {"queries": queries, "top_k": top_k}))["results"]

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` body; raises ``RetrievalError`` when it is down."""
        return await self._request("GET", "/health")

    async def aclose(self) -> None:
        """Close the running loop's connection pool."""
        client = self._clients.pop()
        if client is not None:
            await client.aclose()


def format_passages(results: list[dict[str, Any]], max_chars: int | None = None) -> str:
    """Numbered passages with titles, for a model to read; ``max_chars`` cuts each passage's text."""
    if not results:
        return "No passages found."
    blocks = []
    for n, r in enumerate(results, 1):
        text = str(r.get("contents", "")).strip()
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars].rstrip() + "..."
        title = str(r.get("title") or "").strip()
        blocks.append(f"[{n}] {title}\n{text}" if title else f"[{n}] {text}")
    return "\n\n".join(blocks)


def make_local_search_tool(base_url: str, token: str | None = None, *, max_chars: int | None = None,
                           **client_kwargs: Any) -> Any:
    """A Strands tool ``local_search(query, top_k=3)`` bound to one retrieval server.

    ``client_kwargs`` go to ``RetrievalClient`` (``timeout``, ``max_retries``, ...). Every failure
    reaches the model as an error tool result explaining what went wrong. A failed backend
    (``RetrievalUnavailableError``) and a refused token (``RetrievalAuthError``) are raised, so that
    Strands hands the typed exception to the agent's hooks as well (``AfterToolCallEvent.exception``);
    a rejected query is returned as an error result only.
    """
    from strands import tool

    client = RetrievalClient(base_url, token, **client_kwargs)

    @tool(name="local_search")
    async def local_search(query: str, top_k: int = 3) -> Any:
        """Search the document collection and return the most relevant passages, numbered, with titles.

        Args:
            query: What to look for, as a short natural-language search query.
            top_k: How many passages to return (default 3).
        """
        try:
            return format_passages(await client.search(query, top_k), max_chars)
        except (RetrievalUnavailableError, RetrievalAuthError):
            raise  # typed: Strands shows the model "Error: <Type> - <message>" and hooks get the exception
        except RetrievalError as e:
            return {"status": "error", "content": [{"text": f"Search failed: {e}"}]}
        except Exception as e:  # noqa: BLE001 - a tool must answer the model, not crash the agent
            logger.exception("local_search failed")
            return {"status": "error", "content": [{"text": f"Search failed: {type(e).__name__}: {e}"}]}

    local_search.client = client  # type: ignore[attr-defined]  # for health checks and tests
    return local_search


async def check_health(base_url: str, token: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """``/health`` of a server, failing fast (no retries): raises ``RetrievalError`` naming the problem.

    ``/health`` needs no token; ``check_search`` also proves the token is accepted.
    """
    client = RetrievalClient(base_url, token, timeout=timeout, max_retries=0)
    try:
        return await client.health()
    finally:
        await client.aclose()


async def check_search(base_url: str, token: str | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
    """One authenticated ``POST /retrieve``, failing fast: ``RetrievalAuthError`` on a refused token."""
    client = RetrievalClient(base_url, token, timeout=timeout, max_retries=0)
    try:
        return await client.search("health check", 1)
    finally:
        await client.aclose()
