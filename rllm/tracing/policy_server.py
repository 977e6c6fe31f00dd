"""``PolicyServer``: the trainer's policy behind an OpenAI-compatible endpoint, for agents on their own client.

A Strands agent that keeps its own model client (Strands' ``OpenAIModel`` or
``NonStreamingOpenAIModel`` on ``rllm.tracing.get_chat_client_async``) trains by pointing that
client here instead of at the LiteLLM proxy. Each rollout opens a session with its token engine
(``PolicyServer.open``); the client's ``x-rllm-session`` header names it. Every call is served
token-in/token-out by that engine in the rollout's ``TokenSession`` (an appended history extends
one sample, a rewritten one starts a new sample, as under ``RLLMModel``), answered as vLLM answers
with ``return_token_ids`` (``prompt_token_ids``, ``choices[0].token_ids``, logprobs), streamed or
not, and recorded as the proxy records a call (``make_trace``). So ``run_traced_rollout`` reads the
rollout exactly as it reads one from the proxy's store, and the samples are the engine's own.

The agent's factory finds the server in its process's environment (``policy_endpoint``). Errors are
answered as OpenAI-compatible servers answer them, so the client raises what Strands expects: a
prompt that fills the context is a 400 ``context_length_exceeded`` (Strands reduces the history), a
throttled engine a 429, an engine that failed a 503 (infrastructure); anything else a 400 naming the
error. The session keeps the engine's own exception of its latest call (a later call that succeeds
clears it), and every error answer names its call (``x-rllm-call``), so a run that raised because of
that very call ends on the engine's exception, typed as under ``RLLMModel`` (a used-up response
budget is ``MAX_TOKENS``, not an HTTP error); a recovered failure never decides how a later one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from rllm.engine.rollout.token_engine import TokenEngine, TokenSession
from rllm.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    EngineThrottledError,
    EngineUnavailableError,
    InfrastructureError,
    ServerStartError,
)
from rllm.tracing.policy_request import BodyLimit, ChatRequest, IgnoredSampling, error_response, explain, read_body
from rllm.tracing.records import make_trace
from rllm.tracing.session import SESSION_HEADER
from rllm.types import ModelOutput

logger = logging.getLogger(__name__)

BASE_URL_ENV = "RLLM_POLICY_BASE_URL"
"""The server's ``/v1`` URL, set in the process that serves it (the factory reads it)."""
API_KEY_ENV = "RLLM_POLICY_API_KEY"
"""The bearer token the server accepts."""
MODEL_ENV = "RLLM_POLICY_MODEL"
"""The model name the server answers to."""
CALL_HEADER = "x-rllm-call"
"""Response header of an error answer: the failed call (``<session>:<seq>``), as ``ServedSession.error_call``."""


@dataclass(frozen=True)
class PolicyEndpoint:
    """Where an agent on its own client reaches the policy: base URL, key and model name."""

    base_url: str
    api_key: str
    model: str

    def async_client(self, **kwargs: Any) -> Any:
        """A traced ``openai.AsyncOpenAI`` for it (``rllm.tracing.get_chat_client_async``); ``kwargs`` go there."""
        from rllm.tracing.client import get_chat_client_async

        return get_chat_client_async(self.base_url, self.api_key, **kwargs)


def policy_endpoint() -> PolicyEndpoint:
    """The policy endpoint of this process, from ``RLLM_POLICY_BASE_URL``, ``_API_KEY`` and ``_MODEL``.

    The trainer sets them on its rollout workers (``rllm.agent_loop.own_client``); for evaluation,
    set them to the LiteLLM proxy's ``base_url``, ``api_key`` and model name.
    """
    base_url = os.environ.get(BASE_URL_ENV)
    if not base_url:
        raise ConfigurationError(
            f"{BASE_URL_ENV} is not set: the trainer sets it where it serves the policy (rllm.agent_loop.own_client: "
            "true); for evaluation set it, with RLLM_POLICY_API_KEY and RLLM_POLICY_MODEL, to your tracing proxy")
    return PolicyEndpoint(base_url, os.environ.get(API_KEY_ENV, "EMPTY"), os.environ.get(MODEL_ENV, "policy"))


@dataclass
class ServedSession:
    """One rollout open on the server: its engine, token state, traces and the error of its latest call.

    Attributes:
        engine: The rollout's token engine.
        token_session: Its samples, as under ``RLLMModel`` (``token_session.samples``).
        params: Sampling sent on every call under the request's own (``max_tokens`` caps the request's).
        traces: The calls, recorded as the tracing proxy records them.
        error: What the latest call raised (answered 400, 429, 503 or 504); ``None`` once a later call succeeds.
        error_call: That call, as its error answer's ``x-rllm-call`` header names it.
    """

    engine: TokenEngine
    token_session: TokenSession
    params: dict[str, Any] = field(default_factory=dict)
    traces: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    error_call: str | None = None
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PolicyServer:
    """An OpenAI-compatible ``/v1/chat/completions`` over the rollouts' token engines, on 127.0.0.1.

    Serve it in the event loop the rollouts run in (``start``), so calls reach their engines there.
    It holds as the retrieval server does: a malformed field is a 400 naming it, a body over
    ``max_body_bytes`` a 413 before it is read in full (408 when it does not arrive within
    ``body_timeout_s``), a call past ``max_in_flight`` calls in flight a 503 with ``Retry-After``, and
    an engine call past ``request_timeout_s`` is cancelled (its session unwound) and answered 504: the
    last three are infrastructure, which the client retries and the rollout, if they persist, ends on.

    Args:
        model: The model name it answers to (clients send it as ``model``).
        max_body_bytes: Largest request body.
        max_in_flight: Most chat calls served at once, over all sessions.
        request_timeout_s: Longest an engine call may take (``None``: unbounded).
        body_timeout_s: Longest a request's body may take to arrive.
        retry_after_s: Seconds sent in ``Retry-After`` with a 503.
    """

    def __init__(self, model: str = "policy", *, max_body_bytes: int = 8 * 1024 * 1024, max_in_flight: int = 1024,
                 request_timeout_s: float | None = 900.0, body_timeout_s: float = 30.0,
                 retry_after_s: int = 1) -> None:
        if max_body_bytes < 1 or max_in_flight < 1:
            raise ValueError("max_body_bytes and max_in_flight must be at least 1")
        self.model = model
        self.api_key = secrets.token_urlsafe(24)
        self.port: int | None = None
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s
        self.retry_after_s = retry_after_s
        self.ignored_sampling = IgnoredSampling("the policy server ignores the sampling its clients send")
        self._in_flight = 0
        self._sessions: dict[str, ServedSession] = {}
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._limit = BodyLimit(None, max_bytes=max_body_bytes, timeout_s=body_timeout_s)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("PolicyServer is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def path(self) -> str:
        """Where the traces are (named in ``run_traced_rollout``'s errors)."""
        return f"the policy server at {self.base_url}" if self.port is not None else "a policy server not started"

    def endpoint(self) -> PolicyEndpoint:
        return PolicyEndpoint(self.base_url, self.api_key, self.model)

    def export(self) -> None:
        """Set ``RLLM_POLICY_*`` in this process's environment, where an agent factory reads them."""
        os.environ.update({BASE_URL_ENV: self.base_url, API_KEY_ENV: self.api_key, MODEL_ENV: self.model})

    async def start(self) -> PolicyServer:
        """Serve on a free port in the running event loop; return once it accepts requests (again: at once).

        A start that fails raises ``ServerStartError`` here and in every task awaiting the same start;
        a later ``start`` tries again.
        """
        if self._ready is not None:  # started, or starting in another task of this loop
            await asyncio.shield(self._ready)
            return self
        ready = self._ready = asyncio.get_running_loop().create_future()
        try:
            await self._serve()
        except BaseException as error:
            failed = error if isinstance(error, ServerStartError) else ServerStartError(
                f"the policy server did not start: {type(error).__name__}: {error}")
            ready.set_exception(failed)
            ready.exception()  # retrieved here: waiters, if any, raise it too
            self._ready, self._server, self._task, self.port = None, None, None, None
            if failed is error:
                raise
            raise failed from error
        ready.set_result(None)
        logger.info("policy server for agents on their own client at %s", self.base_url)
        return self

    async def _serve(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._limit.app = self._app()
        config = uvicorn.Config(self._limit, host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"policy-server-{self.port}")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise ServerStartError("the policy server stopped while starting")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving (requests in flight finish)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server, self._task, self._ready = None, None, None

    @contextlib.contextmanager
    def open(self, session_id: str, engine: TokenEngine, params: dict[str, Any] | None = None,
             ) -> Iterator[ServedSession]:
        """Serve the calls tagged ``session_id`` with ``engine`` while the block runs."""
        if session_id in self._sessions:
            raise ValueError(f"session {session_id} is already open on the policy server")
        served = ServedSession(engine, engine.new_session(), dict(params or {}))
        self._sessions[session_id] = served
        try:
            yield served
        finally:
            del self._sessions[session_id]

    def get_session(self, session_id: str) -> list[dict[str, Any]]:
        """The calls of an open session, as ``TraceStore.get_session`` returns them."""
        served = self._sessions.get(session_id)
        return list(served.traces) if served is not None else []

    # ------------------------------------------------------------------ HTTP
    def _app(self) -> FastAPI:
        app = FastAPI(title="rllm policy server", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/v1/models")
        async def models(request: Request) -> Response:
            if (denied := self._denied(request)) is not None:
                return denied
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            if (denied := self._denied(request)) is not None:
                return denied
            return await self._chat(request)

        return app

    def _denied(self, request: Request) -> Response | None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
            return _error(401, "wrong or missing API key (RLLM_POLICY_API_KEY)", code="invalid_api_key")
        return None

    async def _chat(self, request: Request) -> Response:
        """Read and validate the body, find its session, and serve it within the server's bounds."""
        raw = await read_body(request, self._limit)
        if isinstance(raw, Response):
            return raw
        try:
            sent = json.loads(raw)
            body = ChatRequest.model_validate(sent)
        except ValueError as error:  # not JSON, or a field of the wrong type or value
            message = explain(error) if isinstance(error, ValidationError) else f"the request body is not JSON: {error}"
            return _error(400, message, code="invalid_request")
        if body.model != self.model:
            return _error(404, f"model {body.model!r} is not served here; this server serves "
                               f"{self.model!r} ({MODEL_ENV})", code="model_not_found")
        if (why := body.unservable()) is not None:
            return _error(400, why, code="unsupported_parameter")
        session_id = request.headers.get(SESSION_HEADER, "")
        served = self._sessions.get(session_id)
        if served is None:
            return _error(400, f"no rollout session {session_id!r} is open on this policy server: call it with "
                               "rllm.tracing.get_chat_client_async inside the trainer's rollout")
        self.ignored_sampling.note(body.owned_by_trainer(sent), logger)
        if self._in_flight >= self.max_in_flight:
            return self._failed(served, session_id, None, EngineUnavailableError(
                f"the policy server holds {self._in_flight} calls, its limit (max_in_flight)", url=self.base_url,
                cause="overloaded"), 503, {"Retry-After": str(self.retry_after_s)})
        self._in_flight += 1
        try:
            return await self._complete(served, session_id, sent, body)
        finally:
            self._in_flight -= 1

    async def _complete(self, served: ServedSession, session_id: str, sent: dict[str, Any],
                        body: ChatRequest) -> Response:
        caps = [int(v) for v in (served.params.get("max_tokens"), body.cap()) if v is not None]
        sampling = dict(served.params)
        if caps:
            sampling["max_tokens"] = min(caps)
        messages = sent["messages"]  # as sent (validated): the session compares and renders what the client wrote
        tools = body.tools or None
        started = time.time()
        seq = next(served._seq)
        async def call() -> ModelOutput:
            async with served._lock:  # one call at a time extends a session's tokens
                return await served.engine.get_model_response(messages, tools, session=served.token_session,
                                                              **sampling)

        try:
            raw = _completion(await asyncio.wait_for(call(), self.request_timeout_s), self.model, served.engine)
        except asyncio.TimeoutError:  # the engine call was cancelled, so its session is unwound
            return self._failed(served, session_id, seq, EngineUnavailableError(
                f"the engine did not answer within {self.request_timeout_s:g} s (request_timeout_s)",
                url=self.base_url, cause="timeout"), 504)
        except ContextLengthExceededError as error:  # Strands may reduce the history and call again
            return self._failed(served, session_id, seq, error, 400, message=f"maximum context length exceeded: "
                                f"{error}", code="context_length_exceeded")
        except Exception as error:  # noqa: BLE001 - answered (a bug as a 400, never a 5xx the client would
            status = 429 if isinstance(error, EngineThrottledError) else \
                503 if isinstance(error, InfrastructureError) else 400  # take for infrastructure), kept typed
            return self._failed(served, session_id, seq, error, status)
        served.error, served.error_call = None, None
        served.traces.append(make_trace(
            session_id=session_id, seq=seq, no_session=False, model=self.model, backend="rllm-policy-server",
            params=sent, stream=bool(body.stream), started_at=started, raw_response=raw))
        if not body.stream:
            return JSONResponse(raw)
        usage = bool(body.stream_options is not None and body.stream_options.include_usage)
        return StreamingResponse(_sse(raw, usage), media_type="text/event-stream")

    @staticmethod
    def _failed(served: ServedSession, session_id: str, seq: int | None, error: BaseException, status: int,
                headers: dict[str, str] | None = None, *, message: str | None = None,
                code: str | None = None) -> Response:
        """Keep ``error`` as the session's latest and answer it, naming the call in ``x-rllm-call``."""
        call = f"{session_id}:{seq if seq is not None else 'refused'}"
        served.error, served.error_call = error, call
        logger.debug("session %s: call %s failed: %s", session_id, call, error)
        return _error(status, message or f"{type(error).__name__}: {error}", code=code or type(error).__name__,
                      headers={**(headers or {}), CALL_HEADER: call})


class _Server(uvicorn.Server):
    """uvicorn serving inside a host process (a verl worker, a trainer), whose signals stay its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


_error = error_response


def _completion(output: ModelOutput, model: str, engine: TokenEngine) -> dict[str, Any]:
    """The answer as vLLM writes it with ``return_token_ids`` and ``logprobs``."""
    message: dict[str, Any] = {"role": "assistant", "content": output.text or None}
    if output.reasoning:
        message["reasoning_content"] = output.reasoning
    if output.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in output.tool_calls]
    completion = list(output.completion_ids or [])
    logprobs: dict[str, Any] | None = None
    if output.logprobs is not None:
        tokens = engine.tokenizer.convert_ids_to_tokens(completion)
        logprobs = {"content": [{"token": str(t), "logprob": float(lp), "bytes": None, "top_logprobs": []}
                                for t, lp in zip(tokens, output.logprobs, strict=True)]}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "prompt_token_ids": list(output.prompt_ids or []),
        "choices": [{"index": 0, "message": message, "finish_reason": output.finish_reason or "stop",
                     "token_ids": completion, "logprobs": logprobs}],
        "usage": dict(output.usage),
    }


async def _sse(raw: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """The completion replayed as chat-completion chunks: reasoning, text, each tool call, the finish, usage."""
    choice = raw["choices"][0]
    message = choice["message"]
    base = {"id": raw["id"], "object": "chat.completion.chunk", "created": raw["created"], "model": raw["model"]}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning_content"):
        deltas.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": raw["usage"]})
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"
