"""The retrieval HTTP service: ``POST /retrieve``, ``POST /batch_retrieve``, ``GET /health``, ``/metrics``, ``/stats``.

Every bad input gets a 4xx whose ``detail`` names the problem (an unknown field included: it is
refused, not dropped); a full queue gets 503 with ``Retry-After``; shutdown answers the requests
already in flight. Binds 127.0.0.1 unless told otherwise, and with a token set (``$RETRIEVAL_TOKEN``,
the variable the client reads too, or ``--token``) every route but ``/health`` and the API docs
needs ``Authorization: Bearer <token>``. It also speaks the API of rLLM's ``rag_server.py``: its
request fields (``k`` overrides ``top_k``, which defaults to 10), each passage's text as
``content``, ``/health``'s ``"healthy"`` and ``/stats``; rag/README.md has the two side by side.

    python -m rag.server --index-dir .cache/rag/hotpotqa-minilm --port 8000
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import pydantic_core
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from rag.batcher import Answer, Batcher
from rag.client import TOKEN_ENV
from rag.errors import Overloaded
from rag.metrics import ServerMetrics
from rag.schemas import (
    DEFAULT_TOP_K,
    BatchRetrieveRequest,
    BatchRetrieveResponse,
    Passage,
    RetrieveRequest,
    RetrieveResponse,
    body_doc,
    explain,
)

__all__ = ["DEFAULT_TOP_K", "BatchRetrieveRequest", "BatchRetrieveResponse", "Passage", "RetrievalApp",
           "RetrieveRequest", "RetrieveResponse", "RetrieverLike", "ServerSettings", "create_app",
           "token_from_env"]

logger = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"})
_LEGACY_TOKEN_ENV = "RAG_TOKEN"


class ServerSettings(BaseModel):
    """Limits and batching knobs of one server.

    Attributes:
        max_batch_size: Most queries encoded and searched together.
        max_queue: Most queries waiting for a batch; past it requests get 503.
        cache_passages: LRU cache size, counted in passages held (0 turns the cache off).
        max_top_k: Largest ``top_k`` a request may ask for.
        max_query_chars: Longest query accepted.
        max_batch_queries: Most queries in one ``/batch_retrieve``.
        max_body_bytes: Largest request body (413 above).
        retry_after: Seconds sent in ``Retry-After`` with a 503.
        drain_timeout: Seconds shutdown waits for work in flight.
        body_timeout: Seconds a request may take to deliver its whole body once its head arrived
            (408 and close after); the HTTP server's own limits are in ``rag.serving.HttpLimits``.
        token: Bearer token required on every route but ``/health`` and the docs; None for none.
    """

    max_batch_size: int = 128
    max_queue: int = 4096
    cache_passages: int = 100_000
    max_top_k: int = 100
    max_query_chars: int = 2048
    max_batch_queries: int = 256
    max_body_bytes: int = 65536
    retry_after: int = 1
    drain_timeout: float = 30.0
    body_timeout: float = 10.0
    token: str | None = None


class RetrieverLike(Protocol):
    """What the app needs from ``rag.retriever.Retriever`` (tests wrap it to slow it down).

    A ``workers`` attribute (threads that may call ``search`` at once) is read when present; else 1.
    """

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]: ...

    def describe(self) -> dict[str, Any]: ...


class _ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


# ----------------------------------------------------------------------------- ASGI guard (auth + body size)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _BodyTooLarge(Exception):
    pass


class _BodyTimeout(Exception):
    pass


FastHandler = Callable[[bytes], Awaitable[bytes]]
_TIMEOUT_AT: Callable[[float], Any] | None = getattr(asyncio, "timeout_at", None)
"""``asyncio.timeout_at`` (Python 3.11+); on 3.10 a body read waits with ``asyncio.wait_for`` instead."""
_JSON_HEADERS = [(b"content-type", b"application/json")]


class RetrievalApp:
    """The server's ASGI app: bearer token, body size and body read timeout, checked before any route runs.

    The body deadline runs from the moment the head arrived and covers the whole body, so a client
    trickling one byte a second is cut off as surely as one that stops; it ends with the body.
    ``fast`` maps POST paths to handlers answered right here (body bytes in, JSON bytes out). It
    wraps the FastAPI app from outside, so the hot path skips FastAPI's and Starlette's middleware
    stack, router and request objects (that stack took over half the event loop's time per
    request); everything else (``/health``, ``/metrics``, the docs, lifespan) goes to ``app``.
    """

    def __init__(self, app: Any, *, max_body_bytes: int, token: str | None, metrics: ServerMetrics,
                 body_timeout: float, fast: Mapping[str, FastHandler] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.expected = f"Bearer {token}".encode() if token else None
        self.metrics = metrics
        self.body_timeout = body_timeout
        self.fast = dict(fast or {})

    @property
    def state(self) -> Any:
        """The FastAPI app's state (``batcher``, ``metrics``, ``settings``)."""
        return self.app.state

    async def _reject(self, send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self.metrics.errors[status] += 1
        body = pydantic_core.to_json({"detail": message})
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in _OPEN_PATHS:
            given = headers.get(b"authorization")
            if given is None or not hmac.compare_digest(given, self.expected):
                what = "missing" if given is None else "wrong"
                await self._reject(send, 401, f"{what} bearer token: send 'Authorization: Bearer <token>'",
                                   {"WWW-Authenticate": "Bearer"})
                return
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > limit
            except ValueError:
                await self._reject(send, 400, "Content-Length header is not a number")
                return
            if too_big:
                await self._reject(send, 413, f"request body is {int(declared)} bytes; the limit is {limit}")
                return

        seen = 0
        body_done = False
        started = False
        deadline = asyncio.get_running_loop().time() + self.body_timeout

        async def guarded_receive() -> Message:
            nonlocal seen, body_done
            if body_done:  # after the body only a disconnect can come: no deadline for that wait
                return await receive()
            try:
                if _TIMEOUT_AT is not None:
                    async with _TIMEOUT_AT(deadline):
                        message = await receive()
                else:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except (TimeoutError, asyncio.TimeoutError):
                raise _BodyTimeout from None
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        handler = self.fast.get(scope["path"]) if scope["method"] == "POST" else None
        try:
            if handler is None:
                await self.app(scope, guarded_receive, tracking_send)
                return
            chunks = []
            while True:
                message = await guarded_receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            payload = await handler(b"".join(chunks))
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
        except _ApiError as error:
            await self._reject(send, error.status, error.message, error.headers)
        except _BodyTooLarge:
            if not started:
                await self._reject(send, 413, f"request body exceeds the limit of {limit} bytes")
        except _BodyTimeout:
            if not started:
                await self._reject(send, 408, f"request body not received within {self.body_timeout:g} s",
                                   {"Connection": "close"})
        except Exception as error:  # a bug: answer 500 with its name (the router's error middleware is not above us)
            logger.exception("%s %s failed", scope["method"], scope["path"])
            if not started:
                await self._reject(send, 500, f"internal error: {type(error).__name__}: {error}")


# ----------------------------------------------------------------------------- app
def _lifespan(batcher: Batcher, drain_timeout: float) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: at shutdown the batcher answers the work in flight, then stops."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.drain(drain_timeout)
        batcher.close()

    return lifespan


def _index_kind(about: dict[str, Any]) -> tuple[list[str], str]:
    """The index's GPUs and rLLM's ``index_type`` for it (``dense_gpu_N`` or ``dense_cpu``)."""
    gpus = [d for d in about.get("index", {}).get("devices", []) if d.startswith("cuda")]
    return gpus, f"dense_gpu_{len(gpus)}" if gpus else "dense_cpu"


class _Endpoints:
    """The two POST routes as body bytes in, JSON bytes out: ``RetrievalApp`` answers them without FastAPI."""

    def __init__(self, batcher: Batcher, metrics: ServerMetrics, limits: dict[str, int], default_top_k: int,
                 method: str) -> None:
        self.batcher = batcher
        self.metrics = metrics
        self.limits = limits
        self.default_top_k = default_top_k
        self.method_json = pydantic_core.to_json(method)  # rLLM's /retrieve field

    def _parse(self, model: type[BaseModel], body: bytes) -> Any:
        try:
            return model.model_validate_json(body, context=self.limits)
        except ValidationError as e:
            raise _ApiError(*explain(e, model)) from None

    async def _run(self, queries: list[str], top_k: int) -> list[Answer]:
        try:
            return await self.batcher.answers([q.strip() for q in queries], top_k)
        except Overloaded as e:
            raise _ApiError(503, str(e), {"Retry-After": str(e.retry_after)}) from None
        except Exception as e:  # the batcher logged the traceback
            raise _ApiError(500, f"retrieval failed: {type(e).__name__}: {e}") from None

    async def retrieve(self, body: bytes) -> bytes:
        """``POST /retrieve``: top-k passages for one query."""
        self.metrics.requests["retrieve"] += 1
        start = time.perf_counter()
        req = self._parse(RetrieveRequest, body)
        top_k = req.passages_wanted(self.default_top_k)
        answer = (await self._run([req.query], top_k))[0]
        self.metrics.record_latency(time.perf_counter() - start)
        return b'{"query":%b,"top_k":%d,"method":%b,"num_results":%d,"results":%b}' % (
            pydantic_core.to_json(req.query), top_k, self.method_json, len(answer.results), answer.json)

    async def batch_retrieve(self, body: bytes) -> bytes:
        """``POST /batch_retrieve``: top-k passages for each of several queries, in order."""
        self.metrics.requests["batch_retrieve"] += 1
        start = time.perf_counter()
        req = self._parse(BatchRetrieveRequest, body)
        top_k = req.passages_wanted(self.default_top_k)
        answers = await self._run(req.queries, top_k)
        self.metrics.record_latency(time.perf_counter() - start)
        return b'{"top_k":%d,"results":[%b]}' % (top_k, b",".join(a.json for a in answers))


def _add_post_routes(app: FastAPI, endpoints: _Endpoints) -> None:
    """The two POST routes on ``app``, for the API docs and for callers that reach the FastAPI app itself."""

    @app.post("/retrieve", response_model=RetrieveResponse, openapi_extra=body_doc(RetrieveRequest),
              responses={400: {}, 401: {}, 408: {}, 413: {}, 422: {}, 503: {}})
    async def retrieve(request: Request) -> Response:
        """Top-k passages for one query."""
        return Response(await endpoints.retrieve(await request.body()), media_type="application/json")

    @app.post("/batch_retrieve", response_model=BatchRetrieveResponse, openapi_extra=body_doc(BatchRetrieveRequest),
              responses={400: {}, 401: {}, 408: {}, 413: {}, 422: {}, 503: {}})
    async def batch_retrieve(request: Request) -> Response:
        """Top-k passages for each of several queries, in order."""
        return Response(await endpoints.batch_retrieve(await request.body()), media_type="application/json")


def _add_status_routes(app: FastAPI, retriever: RetrieverLike, about: dict[str, Any], started: float) -> None:
    """``/health``, ``/metrics`` and ``/stats`` on ``app``, reading its state (batcher, metrics, settings)."""
    batcher: Batcher = app.state.batcher
    metrics: ServerMetrics = app.state.metrics
    settings: ServerSettings = app.state.settings
    gpus, index_type = _index_kind(about)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Corpus size, index type and devices, encoder, batching settings; rLLM's health fields too."""
        metrics.requests["health"] += 1
        return {
            "status": "healthy",
            **retriever.describe(),
            "index_type": index_type,
            "index_loaded": True,
            "gpu_available": bool(gpus),
            "num_gpus": len(gpus),
            "embedding_device": about.get("encoder", {}).get("device"),
            "batching": {"max_batch_size": settings.max_batch_size, "max_queue": settings.max_queue,
                         "cache_passages": settings.cache_passages, "workers": batcher.workers, "timeout_ms": 0.0},
            "limits": {**_request_limits(settings), "max_body_bytes": settings.max_body_bytes,
                       "body_timeout": settings.body_timeout},
            "auth": settings.token is not None,
            "stats": ServerMetrics.batching_stats(batcher),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - started, 1),
        }

    @app.get("/metrics")
    async def metrics_route() -> dict[str, Any]:
        """Requests, errors, batch-size histogram, latency percentiles, queue depth, cache hit rate."""
        metrics.requests["metrics"] += 1
        return metrics.snapshot(batcher)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Batches, queries computed, mean batch size and throughput, as rLLM's server names them."""
        metrics.requests["stats"] += 1
        return ServerMetrics.batching_stats(batcher)


def _request_limits(settings: ServerSettings) -> dict[str, int]:
    """The limits a request body is validated against (the validation context of ``rag.schemas``)."""
    return {"max_query_chars": settings.max_query_chars, "max_top_k": settings.max_top_k,
            "max_batch_queries": settings.max_batch_queries}


def create_app(retriever: RetrieverLike, settings: ServerSettings | None = None) -> RetrievalApp:
    """The ASGI app serving ``retriever``; state lives on ``app.state`` (``batcher``, ``metrics``)."""
    settings = settings or ServerSettings()
    metrics = ServerMetrics()
    batcher = Batcher(retriever.search, max_batch_size=settings.max_batch_size, max_queue=settings.max_queue,
                      cache_passages=settings.cache_passages, retry_after=settings.retry_after,
                      workers=getattr(retriever, "workers", 1), on_batch=metrics.record_batch)
    started = time.time()
    about = retriever.describe()
    gpus, index_type = _index_kind(about)
    endpoints = _Endpoints(batcher, metrics, _request_limits(settings), min(DEFAULT_TOP_K, settings.max_top_k),
                           method=f"{index_type}_batched" if gpus else "dense_batched")

    app = FastAPI(title="rllm retrieval service", version="1.0", lifespan=_lifespan(batcher, settings.drain_timeout),
                  description="Dense passage retrieval (FAISS + a sentence-transformers model), batched.")
    app.state.batcher = batcher
    app.state.metrics = metrics
    app.state.settings = settings

    @app.exception_handler(_ApiError)
    async def _api_error(_request: Request, error: _ApiError) -> JSONResponse:
        metrics.errors[error.status] += 1
        return _error(error.status, error.message, error.headers)

    _add_post_routes(app, endpoints)
    _add_status_routes(app, retriever, about, started)
    # RetrievalApp answers the two POSTs itself (see its ``fast``); the routes above document them.
    return RetrievalApp(app, max_body_bytes=settings.max_body_bytes, token=settings.token, metrics=metrics,
                        body_timeout=settings.body_timeout,
                        fast={"/retrieve": endpoints.retrieve, "/batch_retrieve": endpoints.batch_retrieve})


# ----------------------------------------------------------------------------- command line
def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token from ``RETRIEVAL_TOKEN``, the variable the client reads too.

    ``RAG_TOKEN`` (this server's former variable) is still read when ``RETRIEVAL_TOKEN`` is unset,
    with a deprecation warning: a token that only the server knows makes every search a 401.
    """
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV) or None
    legacy = env.get(_LEGACY_TOKEN_ENV) or None
    if token is None and legacy is not None:
        logger.warning("%s is deprecated: set %s instead (the local_search tool reads %s, so a token in %s alone "
                       "makes every search fail with 401)", _LEGACY_TOKEN_ENV, TOKEN_ENV, TOKEN_ENV, _LEGACY_TOKEN_ENV)
        return legacy
    if token is not None and legacy is not None and legacy != token:
        logger.warning("%s differs from %s and is ignored", _LEGACY_TOKEN_ENV, TOKEN_ENV)
    return token


if __name__ == "__main__":
    # ``python -m rag.server`` runs the command line, which lives in rag/cli.py and imports this module (so this
    # module imports nothing of it): load the index named on the command line and serve it until SIGINT/SIGTERM.
    import runpy

    runpy.run_module("rag.cli", run_name="__main__")
