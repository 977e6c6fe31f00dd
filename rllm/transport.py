"""One HTTP transport for rllm's clients: pooled, retried, bounded in time, and failures described one way.

The engines (``OpenAIEngine``, the token engines' ``JSONClient``) and the retrieval client
(``rag.client``) send JSON through ``HTTPTransport``; the ``http_request`` tool and the tracing
proxy's ``TokenIdBackend`` open their clients with ``open_client`` (neither retries: a policy's
request is sent once, and the backend reports each failure to LiteLLM as it came), the SGLang
served-weights check with ``open_sync_client``, the traced OpenAI clients (``rllm.tracing.client``) with
``open_openai_client`` / ``open_openai_sync_client``. No other module builds an HTTP client.

* One ``httpx.AsyncClient`` per event loop (an httpx pool cannot cross loops, and Strands'
  synchronous ``Agent.__call__`` runs each call on a fresh loop), with a finite timeout per attempt.
* Connection failures, timeouts and the statuses the caller names retryable are retried with
  capped, jittered exponential backoff (``rllm.retry``); a ``Retry-After`` header is honoured, capped.
* Whatever fails is described once, as an ``HTTPFailure``: no answer (unreachable, timed out), a
  status with the server's own words, or an answer that is not JSON. ``HTTPFailure.infrastructure``
  says whether the request itself was at fault; each caller turns the failure into its own typed
  error of ``rllm.errors`` (or ``rag.errors``) with the ``error`` function it gives the transport.

Importing this module loads httpx and nothing else of rllm: ``rllm.retry`` (tenacity) is imported
when an ``HTTPTransport`` is made, so the LiteLLM proxy's own environment, which has httpx but not
tenacity, imports ``open_client`` too (``rllm.tracing.backend`` runs there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from rllm.retry import PerLoop

logger = logging.getLogger(__name__)

_DETAIL_CHARS = 500
_BODY_CHARS = 2000
_CREDENTIAL_STATUSES = frozenset({401, 403})


@dataclass(frozen=True)
class HTTPFailure:
    """One failed exchange, as every rllm client describes it.

    Attributes:
        url: The URL requested.
        cause: What went wrong, as error messages quote it: ``"request timed out"``,
            ``"connection failed: ..."``, ``"HTTP 503: <the server's words>"``.
        attempts: Attempts made (the first one included).
        status: The HTTP status, or ``None`` when no answer came.
        detail: The server's own words (a JSON error's message, else the body's text); empty without an answer.
        body: The answer's text, cut to 2,000 characters (for callers that look for a phrase in it).
        garbled: The server answered 2xx, but not with JSON.
    """

    url: str
    cause: str
    attempts: int
    status: int | None = None
    detail: str = ""
    body: str = ""
    garbled: bool = False

    @property
    def infrastructure(self) -> bool:
        """Not the request's fault: no answer, throttled (429), a server error (5xx) or a garbled answer."""
        return self.status is None or self.garbled or self.status == 429 or self.status >= 500

    @property
    def throttled(self) -> bool:
        """The server answered 429 (too many requests)."""
        return self.status == 429

    @property
    def refused_credentials(self) -> bool:
        """The server answered 401 or 403: the credentials sent are missing or wrong."""
        return self.status in _CREDENTIAL_STATUSES


def describe_error(error: BaseException) -> str:
    """What went wrong when no answer came, in the words every rllm client's messages use."""
    if isinstance(error, httpx.ConnectError):
        reason = f" ({error})" if str(error) else ""
        return f"connection failed: connection refused or host unreachable{reason}"
    if isinstance(error, httpx.TimeoutException):
        return "request timed out"
    if isinstance(error, httpx.TransportError):
        return f"connection failed ({type(error).__name__}{f': {error}' if str(error) else ''})"
    return f"{type(error).__name__}: {error}"


def response_detail(response: httpx.Response) -> str:
    """The server's own words about a failed request: a JSON error's message, else the body's text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:_DETAIL_CHARS] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        for words in (error.get("message") if isinstance(error, dict) else error, body.get("detail"),
                      body.get("message")):
            if words not in (None, ""):
                return str(words)[:_DETAIL_CHARS]
    return str(body)[:_DETAIL_CHARS]


def failure_from_response(url: str, response: httpx.Response, attempts: int) -> HTTPFailure:
    """The ``HTTPFailure`` of an answer with an error status."""
    detail = response_detail(response)
    return HTTPFailure(url, f"HTTP {response.status_code}: {detail}", attempts, response.status_code, detail,
                       response.text[:_BODY_CHARS])


def failure_from_error(url: str, error: BaseException, attempts: int) -> HTTPFailure:
    """The ``HTTPFailure`` of an attempt that got no answer (refused, unreachable, timed out)."""
    return HTTPFailure(url, describe_error(error), attempts)


def is_infrastructure_status(status: int) -> bool:
    """429 and 5xx: statuses worth another try for a server that is busy or failing (the engines' rule)."""
    return status == 429 or status >= 500


def _client_options(timeout: float, base_url: str, max_connections: int | None, headers: Mapping[str, str] | None,
                    follow_redirects: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"base_url": base_url, "timeout": timeout, "headers": dict(headers or {}),
                               "follow_redirects": follow_redirects}
    if max_connections is not None:
        options["limits"] = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return options


def open_client(*, timeout: float, base_url: str = "", max_connections: int | None = None,
                headers: Mapping[str, str] | None = None, follow_redirects: bool = False) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` with a finite timeout; ``max_connections`` sizes its pool (else httpx's default)."""
    return httpx.AsyncClient(**_client_options(timeout, base_url, max_connections, headers, follow_redirects))


def open_sync_client(*, timeout: float, base_url: str = "", max_connections: int | None = None,
                     headers: Mapping[str, str] | None = None, follow_redirects: bool = False) -> httpx.Client:
    """``open_client``'s blocking twin, for callers outside an event loop (the served-weights check)."""
    return httpx.Client(**_client_options(timeout, base_url, max_connections, headers, follow_redirects))


_OPENAI_OPTIONS: dict[str, Any] = {"timeout": httpx.Timeout(600.0, connect=5.0), "follow_redirects": True,
                                   "limits": httpx.Limits(max_connections=1000, max_keepalive_connections=100)}
"""openai's own defaults for the client it would build (``openai.DefaultAsyncHttpxClient``)."""


def open_openai_client() -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for an ``openai.AsyncOpenAI``, with openai's defaults (10 minutes, 5 s to connect).

    openai takes an httpx client as its own (a "legacy" one); the tracing clients add their hook to it.
    """
    return httpx.AsyncClient(**_OPENAI_OPTIONS)


def open_openai_sync_client() -> httpx.Client:
    """``open_openai_client``'s blocking twin, for an ``openai.OpenAI``."""
    return httpx.Client(**_OPENAI_OPTIONS)


class _RetryableStatus(Exception):
    """An answer whose status the caller retries; carries it through tenacity."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {response_detail(response)}")
        self.response = response
        self.retry_after: float | None
        try:
            self.retry_after = float(response.headers.get("retry-after", ""))
        except ValueError:
            self.retry_after = None


def _retryable(error: BaseException) -> bool:
    return isinstance(error, (_RetryableStatus, httpx.TransportError))


def _describe_attempt(error: BaseException) -> str:
    return str(error) if isinstance(error, _RetryableStatus) else describe_error(error)


def _retry_after(error: BaseException) -> float | None:
    return error.retry_after if isinstance(error, _RetryableStatus) else None


@dataclass
class HTTPTransport:
    """Requests to one server through one pooled client per event loop, retried, failing with typed errors.

    Attributes:
        base_url: Server root, e.g. ``http://127.0.0.1:8000`` (paths are appended).
        error: Turns an ``HTTPFailure`` into the exception the caller raises (its own typed error).
        timeout: Seconds one attempt may take, all phases (connect, write, read, pool).
        max_retries: Retries after the first attempt, for retryable failures only.
        backoff_initial: First backoff in seconds; doubles each retry, jittered.
        backoff_max: Cap on one backoff (and on a server's ``Retry-After``), in seconds.
        max_connections: Pool size per event loop.
        headers: Sent with every request (a bearer token, say).
        retry_status: Which answered statuses are retried (connection failures and timeouts always are).
    """

    base_url: str
    error: Callable[[HTTPFailure], Exception]
    timeout: float = 30.0
    max_retries: int = 3
    backoff_initial: float = 0.25
    backoff_max: float = 8.0
    max_connections: int = 256
    headers: Mapping[str, str] | None = None
    retry_status: Callable[[int], bool] = is_infrastructure_status
    _clients: PerLoop[httpx.AsyncClient] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from rllm.retry import PerLoop

        self.base_url = self.base_url.rstrip("/")
        self._clients = PerLoop(self._new_client)

    def _new_client(self) -> httpx.AsyncClient:
        return open_client(timeout=self.timeout, base_url=self.base_url, max_connections=self.max_connections,
                           headers=self.headers)

    def url(self, path: str) -> str:
        """The full URL of ``path``, as failures name it."""
        return f"{self.base_url}{path}"

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: Mapping[str, str] | None = None) -> httpx.Response:
        """The answer (a status below 400), after retrying what is worth retrying; anything else raises ``error``."""
        response, _ = await self._send(method, path, json, headers)
        return response

    async def request_json(self, method: str, path: str, *, json: Any = None,
                           headers: Mapping[str, str] | None = None) -> Any:
        """``request``, and the answer's JSON; an answer that is not JSON raises ``error`` (``garbled``)."""
        response, attempts = await self._send(method, path, json, headers)
        try:
            return response.json()
        except ValueError as parse_error:
            failure = HTTPFailure(self.url(path), f"HTTP {response.status_code}: the answer is not JSON", attempts,
                                  response.status_code, body=response.text[:_BODY_CHARS], garbled=True)
            raise self.error(failure) from parse_error

    async def _send(self, method: str, path: str, json: Any,
                    headers: Mapping[str, str] | None) -> tuple[httpx.Response, int]:
        from rllm.retry import backoff_retrying

        url = self.url(path)
        retrying = backoff_retrying(
            url, max_retries=self.max_retries, backoff_initial=self.backoff_initial, backoff_max=self.backoff_max,
            retryable=_retryable, describe=_describe_attempt, retry_after=_retry_after,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    response = await self._clients.get().request(method, path, json=json, headers=headers)
                    if self.retry_status(response.status_code):
                        raise _RetryableStatus(response)
        except _RetryableStatus as status:
            raise self.error(failure_from_response(url, status.response, attempts)) from status
        except httpx.TransportError as error:
            raise self.error(failure_from_error(url, error, attempts)) from error
        if response.status_code >= 400:
            raise self.error(failure_from_response(url, response, attempts))
        return response, attempts

    async def aclose(self) -> None:
        """Close the running loop's connection pool."""
        client = self._clients.pop()
        if client is not None:
            await client.aclose()
