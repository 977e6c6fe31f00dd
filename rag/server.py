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

import argparse
import asyncio
import hmac
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, Protocol

import pydantic_core
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from rag.batcher import Answer, Batcher
from rag.client import TOKEN_ENV
from rag.errors import HttpConfigError, Overloaded
from rag.metrics import ServerMetrics
from rag.serving import HttpLimits, granian_available, serve

logger = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_LEGACY_TOKEN_ENV = "RAG_TOKEN"
_SWITCH_INTERVAL_MS = 5.0
DEFAULT_TOP_K = 10
"""Passages for a request that names no ``top_k`` (rLLM's default), or ``max_top_k`` where that is lower."""


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


# ----------------------------------------------------------------------------- request / response models
def _limits(info: ValidationInfo) -> dict[str, int]:
    return info.context or {}


def _check_query(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_query", "must not be empty or whitespace")
    limit = _limits(info).get("max_query_chars", 2048)
    if len(value) > limit:
        raise PydanticCustomError("query_too_long", "is {length} characters long; the limit is {limit}",
                                  {"length": len(value), "limit": limit})
    return value


def _check_top_k(value: int, info: ValidationInfo) -> int:
    limit = _limits(info).get("max_top_k", 100)
    if not 1 <= value <= limit:
        raise PydanticCustomError("top_k_range", "must be between 1 and {limit} (got {value})",
                                  {"limit": limit, "value": value})
    return value


def _check_count(value: list[str], info: ValidationInfo) -> list[str]:
    limit = _limits(info).get("max_batch_queries", 256)
    if not value:
        raise PydanticCustomError("no_queries", "must hold at least one query")
    if len(value) > limit:
        raise PydanticCustomError("too_many_queries", "holds {count} queries; the limit is {limit}",
                                  {"count": len(value), "limit": limit})
    return value


Query = Annotated[StrictStr, AfterValidator(_check_query)]
TopK = Annotated[StrictInt, AfterValidator(_check_top_k)]


class RetrieveRequest(BaseModel):
    """``POST /retrieve`` body; ``k`` (rLLM's name) overrides ``top_k`` when given. Other fields are a 422."""

    model_config = ConfigDict(extra="forbid")

    query: Query
    top_k: TopK = DEFAULT_TOP_K
    k: TopK | None = None

    def passages_wanted(self, default: int) -> int:
        """``k``, else ``top_k`` when the request gave it, else ``default``."""
        if self.k is not None:
            return self.k
        return self.top_k if "top_k" in self.model_fields_set else default


class BatchRetrieveRequest(BaseModel):
    """``POST /batch_retrieve`` body. Other fields are a 422."""

    model_config = ConfigDict(extra="forbid")

    queries: Annotated[list[Query], AfterValidator(_check_count)]
    top_k: TopK = DEFAULT_TOP_K

    def passages_wanted(self, default: int) -> int:
        """``top_k`` when the request gave it, else ``default``."""
        return self.top_k if "top_k" in self.model_fields_set else default


class Passage(BaseModel):
    """One search hit; ``score`` is the inner product (cosine for normalised encoders).

    ``contents`` is the text without its title; ``content`` is the whole text as the corpus holds it
    (wiki-18's quoted title line included), the field rLLM's server and its clients use.
    """

    id: str
    title: str
    contents: str
    content: str
    score: float


class RetrieveResponse(BaseModel):
    """``POST /retrieve`` answer; ``method`` and ``num_results`` as rLLM's server sends them."""

    query: str
    top_k: int
    method: str
    num_results: int
    results: list[Passage]


class BatchRetrieveResponse(BaseModel):
    """``POST /batch_retrieve`` answer: ``results[i]`` answers ``queries[i]``."""

    top_k: int
    results: list[list[Passage]]


class _ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _explain(error: ValidationError, model: type[BaseModel]) -> tuple[int, str]:
    """One status and one readable line for a failed validation of a ``model`` body."""
    parts = []
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return 400, f"invalid JSON: {e.get('ctx', {}).get('error', e['msg'])}"
        if not e["loc"]:
            return 422, f"request body must be a JSON object ({e['msg']})"
        loc = ".".join(str(part) for part in e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown field (the fields are {', '.join(model.model_fields)})")
        else:
            parts.append(f"{loc}: {e['msg']}")
    return 422, "; ".join(parts)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}


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
def create_app(retriever: RetrieverLike, settings: ServerSettings | None = None) -> RetrievalApp:
    """The ASGI app serving ``retriever``; state lives on ``app.state`` (``batcher``, ``metrics``)."""
    settings = settings or ServerSettings()
    metrics = ServerMetrics()
    batcher = Batcher(retriever.search, max_batch_size=settings.max_batch_size, max_queue=settings.max_queue,
                      cache_passages=settings.cache_passages, retry_after=settings.retry_after,
                      workers=getattr(retriever, "workers", 1), on_batch=metrics.record_batch)
    limits = {"max_query_chars": settings.max_query_chars, "max_top_k": settings.max_top_k,
              "max_batch_queries": settings.max_batch_queries}
    default_top_k = min(DEFAULT_TOP_K, settings.max_top_k)
    started = time.time()
    about = retriever.describe()
    gpus = [d for d in about.get("index", {}).get("devices", []) if d.startswith("cuda")]
    index_type = f"dense_gpu_{len(gpus)}" if gpus else "dense_cpu"  # rLLM's /health field
    method = f"{index_type}_batched" if gpus else "dense_batched"  # rLLM's /retrieve field
    method_json = pydantic_core.to_json(method)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        yield
        await batcher.drain(settings.drain_timeout)
        batcher.close()

    app = FastAPI(title="rllm retrieval service", version="1.0", lifespan=lifespan,
                  description="Dense passage retrieval (FAISS + sentence-transformers) with automatic batching.")
    app.state.batcher = batcher
    app.state.metrics = metrics
    app.state.settings = settings

    @app.exception_handler(_ApiError)
    async def _api_error(_request: Request, error: _ApiError) -> JSONResponse:
        metrics.errors[error.status] += 1
        return _error(error.status, error.message, error.headers)

    def parse(model: type[BaseModel], body: bytes) -> Any:
        try:
            return model.model_validate_json(body, context=limits)
        except ValidationError as e:
            raise _ApiError(*_explain(e, model)) from None

    async def run(queries: list[str], top_k: int) -> list[Answer]:
        try:
            return await batcher.answers([q.strip() for q in queries], top_k)
        except Overloaded as e:
            raise _ApiError(503, str(e), {"Retry-After": str(e.retry_after)}) from None
        except Exception as e:  # the batcher logged the traceback
            raise _ApiError(500, f"retrieval failed: {type(e).__name__}: {e}") from None

    async def retrieve_bytes(body: bytes) -> bytes:
        metrics.requests["retrieve"] += 1
        start = time.perf_counter()
        req = parse(RetrieveRequest, body)
        top_k = req.passages_wanted(default_top_k)
        answer = (await run([req.query], top_k))[0]
        metrics.record_latency(time.perf_counter() - start)
        return b'{"query":%b,"top_k":%d,"method":%b,"num_results":%d,"results":%b}' % (
            pydantic_core.to_json(req.query), top_k, method_json, len(answer.results), answer.json)

    async def batch_retrieve_bytes(body: bytes) -> bytes:
        metrics.requests["batch_retrieve"] += 1
        start = time.perf_counter()
        req = parse(BatchRetrieveRequest, body)
        top_k = req.passages_wanted(default_top_k)
        answers = await run(req.queries, top_k)
        metrics.record_latency(time.perf_counter() - start)
        return b'{"top_k":%d,"results":[%b]}' % (top_k, b",".join(a.json for a in answers))


    @app.post("/retrieve", response_model=RetrieveResponse, openapi_extra=_body_doc(RetrieveRequest),
              responses={400: {}, 401: {}, 408: {}, 413: {}, 422: {}, 503: {}})
    async def retrieve(request: Request) -> Response:
        """Top-k passages for one query."""
        return Response(await retrieve_bytes(await request.body()), media_type="application/json")

    @app.post("/batch_retrieve", response_model=BatchRetrieveResponse, openapi_extra=_body_doc(BatchRetrieveRequest),
              responses={400: {}, 401: {}, 408: {}, 413: {}, 422: {}, 503: {}})
    async def batch_retrieve(request: Request) -> Response:
        """Top-k passages for each of several queries, in order."""
        return Response(await batch_retrieve_bytes(await request.body()), media_type="application/json")

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
            "limits": {**limits, "max_body_bytes": settings.max_body_bytes, "body_timeout": settings.body_timeout},
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

    # RetrievalApp answers the two POSTs itself (see its ``fast``); the routes above document them.
    return RetrievalApp(app, max_body_bytes=settings.max_body_bytes, token=settings.token, metrics=metrics,
                        body_timeout=settings.body_timeout,
                        fast={"/retrieve": retrieve_bytes, "/batch_retrieve": batch_retrieve_bytes})


# ----------------------------------------------------------------------------- CLI
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--index-dir", required=True, help="directory with manifest.json, the index and the corpus")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=None,
                   help=f"bearer token required on every route but /health and the docs (default: the environment "
                        f"variable {TOKEN_ENV}, which the local_search tool reads too; none if unset). Prefer the "
                        f"variable: a token given here is shown by ps to every user of the machine")
    g = p.add_argument_group("index placement")
    g.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    g.add_argument("--gpus", default=None, help="comma-separated GPU ids (default: all visible)")
    g.add_argument("--replicate", action="store_true", help="copy the index to every GPU instead of sharding it")
    g.add_argument("--no-fp16", action="store_true", help="keep float32 vectors on the GPU")
    g.add_argument("--search-backend", choices=["auto", "faiss", "torch"], default="auto",
                   help="auto: faiss-gpu where it loads, else torch exact flat search on the GPUs; torch forces it")
    g.add_argument("--torch-chunk-mb", type=int, default=1024, help="torch search: score-matrix budget per chunk")
    g.add_argument("--temp-memory-mb", type=int, default=None, help="FAISS scratch memory per GPU")
    g.add_argument("--nprobe", type=int, default=None, help="IVF lists probed per query")
    g.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    g.add_argument("--mmap-index", action="store_true", help="memory-map a CPU index file instead of reading it")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the encoder and FAISS, per worker (default: all of them for a search "
                        "running alone, split between searches running side by side)")
    g.add_argument("--query-batch-size", type=int, default=None,
                   help="queries per encoder forward, sorted by length so each forward pads little (default: "
                        "16 on CPU, 32 with --no-trace-encoder, the whole batch on a GPU; 0: the whole batch)")
    g.add_argument("--workers", type=int, default=None,
                   help="batches computed side by side, each on its own thread with its share of the CPU threads "
                        "(default: 2 on a CPU with 2+ cores, 1 on a GPU)")
    g.add_argument("--trace-encoder", action=argparse.BooleanOptionalAction, default=None,
                   help="run the encoder's forward as a TorchScript trace, checked against the eager one at load "
                        "(default: on CPU, where it frees the GIL for the event loop; eager on a GPU)")
    g.add_argument("--switch-interval-ms", type=float, default=_SWITCH_INTERVAL_MS,
                   help="Python's GIL switch interval: how long the compute thread may wait for the GIL while "
                        "the event loop holds it, at every torch op boundary (Python's default is 5)")
    b = p.add_argument_group("batching and limits")
    defaults = ServerSettings()
    for name in ("max_batch_size", "max_queue", "cache_passages", "max_top_k", "max_query_chars",
                 "max_batch_queries", "max_body_bytes", "retry_after"):
        b.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    b.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout)
    h = p.add_argument_group("HTTP limits (slow, silent and oversized clients)")
    http = HttpLimits()
    h.add_argument("--http-server", choices=["granian", "uvicorn"], default="granian",
                   help="granian (default: header read timeout, bounded heads, connection cap) or uvicorn "
                        "(h11; no header read timeout)")
    h.add_argument("--header-timeout", type=float, default=http.header_timeout,
                   help="seconds to receive a complete request head; closes silent and idle connections too")
    h.add_argument("--body-timeout", type=float, default=defaults.body_timeout,
                   help="seconds to receive the whole body after the head (408 after)")
    h.add_argument("--max-header-bytes", type=int, default=http.max_header_bytes,
                   help="largest request head (431 above; at least 8192)")
    h.add_argument("--max-connections", type=int, default=http.max_connections,
                   help="connections served at once; more wait in the listen backlog")
    h.add_argument("--backlog", type=int, default=http.backlog, help="listen backlog")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request (slower)")
    return p


def _in_a_passing_thread(work: Callable[[], Any]) -> Any:
    """``work()`` run in a thread that ends with it.

    OpenMP (torch's and FAISS's) keeps a team of helper threads for every thread that ran a parallel
    region, for as long as that thread lives. Left on the main thread, which goes on as the event loop,
    the loading and warm-up's teams count against the cores, and libgomp then spins less before its
    helpers sleep: every lone query pays the wake-ups (~1.5 ms here). A thread's teams go with it.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-load") as pool:
        return pool.submit(work).result()


def main(argv: list[str] | None = None) -> None:
    """Load the index named on the command line and serve it until SIGINT/SIGTERM."""
    from rag.index import IndexOptions
    from rag.retriever import Retriever

    args = _parser().parse_args(argv)
    limits = HttpLimits(header_timeout=args.header_timeout, max_header_bytes=args.max_header_bytes,
                        max_connections=args.max_connections, backlog=args.backlog)
    try:
        limits.check()
    except HttpConfigError as e:
        _parser().error(str(e))
    if args.http_server == "granian" and not granian_available():
        _parser().error("granian is not installed (pip install -e '.[rag]'); or pass --http-server uvicorn")
    sys.setswitchinterval(args.switch_interval_ms / 1e3)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.token:
        logger.warning("--token puts the token in the process table, where any user of this machine sees it with ps; "
                       "set %s instead", TOKEN_ENV)
    options = IndexOptions(device=args.device, gpus=[int(g) for g in args.gpus.split(",")] if args.gpus else None,
                           shard=not args.replicate, fp16=not args.no_fp16, temp_memory_mb=args.temp_memory_mb,
                           nprobe=args.nprobe, ef_search=args.ef_search, threads=args.threads,
                           search_backend=args.search_backend, torch_chunk_mb=args.torch_chunk_mb)
    query_batch_size: int | None | Literal["auto"] = (
        "auto" if args.query_batch_size is None else args.query_batch_size or None)

    def load() -> Retriever:
        retriever = Retriever.load(args.index_dir, options, threads=args.threads, mmap_index=args.mmap_index,
                                   query_batch_size=query_batch_size,
                                   workers=args.workers or "auto", trace_encoder=args.trace_encoder)
        retriever.search(["warm-up query"], 1)
        return retriever

    retriever = _in_a_passing_thread(load)
    token = args.token or token_from_env()
    settings = ServerSettings(token=token, drain_timeout=args.drain_timeout, body_timeout=args.body_timeout, **{
        k: getattr(args, k) for k in ("max_batch_size", "max_queue", "cache_passages", "max_top_k", "max_query_chars",
                                      "max_batch_queries", "max_body_bytes", "retry_after")})
    if args.host not in _LOOPBACK and token is None:
        logger.warning("serving on %s without a bearer token: anyone who can reach the port can query", args.host)
    serve(create_app(retriever, settings), args.host, args.port, limits, server=args.http_server,
          log_level=args.log_level, access_log=args.access_log, drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    main()
