"""Client side of the retrieval service: ``RetrievalClient`` and the Strands ``local_search`` tool.

Needs only the core install (httpx, tenacity, strands). Requests go through ``rllm.transport``: one
pooled ``httpx.AsyncClient`` per event loop; connection failures, timeouts and 502/503/504 are
retried with capped, jittered backoff (a 503's ``Retry-After`` is honoured).

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

from rag.errors import RetrievalAuthError, RetrievalError, RetrievalUnavailableError
from rllm.transport import HTTPFailure, HTTPTransport

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({502, 503, 504})
TOKEN_ENV = "RETRIEVAL_TOKEN"
"""The environment variable holding the retrieval server's bearer token, on both sides."""


class RetrievalClient:
    """Talks to ``rag.server`` through ``rllm.transport`` (one pool per event loop, retries, typed failures).

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
        self._transport = HTTPTransport(
            self.base_url, self._error, timeout=timeout, max_retries=max_retries, backoff_initial=backoff_initial,
            backoff_max=backoff_max, max_connections=max_connections,
            headers={"Authorization": f"Bearer {token}"} if token else None, retry_status=_RETRY_STATUSES.__contains__,
        )

    def _error(self, failure: HTTPFailure) -> RetrievalError:
        """The retrieval error for a failed exchange: unavailable (infrastructure), a refused token, a bad request."""
        status, attempts = failure.status, failure.attempts
        if failure.garbled:
            return RetrievalUnavailableError(f"retrieval server at {failure.url} sent a non-JSON answer")
        if status is None:
            return RetrievalUnavailableError(f"retrieval server at {self.base_url} is unreachable after {attempts} "
                                             f"attempts: {failure.cause}")
        if status in _RETRY_STATUSES:
            return RetrievalUnavailableError(f"retrieval server at {self.base_url} is overloaded or unavailable "
                                             f"after {attempts} attempts ({failure.cause})", status)
        if failure.refused_credentials:
            sent = "a token it does not accept" if self.token else "no token"
            return RetrievalAuthError(
                f"retrieval server at {self.base_url} rejected the token ({failure.cause}); "
                f"the client sent {sent}: set {TOKEN_ENV} to the token the server was started with", status)
        if status >= 500:
            return RetrievalUnavailableError(f"retrieval server at {self.base_url} failed (HTTP {status}): "
                                             f"{failure.detail}", status)
        return RetrievalError(f"retrieval server rejected the request (HTTP {status}): {failure.detail}", status)

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        return await self._transport.request_json(method, path, json=payload)

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
        await self._transport.aclose()


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
