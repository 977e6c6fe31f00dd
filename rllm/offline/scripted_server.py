"""A real OpenAI-compatible chat-completions HTTP server whose answers come from a script.

Tests, benchmarks and demos point real clients (``openai``, Strands, rLLM engines) at it so
the whole HTTP path is exercised without a model: non-streamed and SSE-streamed replies, tool
calls, vLLM's ``return_token_ids`` extension, logprobs, error statuses and slow replies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rllm.offline.uvicorn_thread import UvicornThread
from rllm.tokens.renderer import content_text

logger = logging.getLogger(__name__)

_SYNTH_PROMPT_IDS = list(range(10))
_SYNTH_TOKEN_IDS = list(range(100, 105))
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_error"}


@dataclass
class ScriptedToolCall:
    """One tool call in a scripted reply; ``arguments`` is sent verbatim (may be invalid JSON)."""

    name: str
    arguments: str
    id: str | None = None


@dataclass
class ScriptedReply:
    """What the server answers to one request; unset fields get OpenAI-like defaults."""

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = field(default_factory=list)
    reasoning_content: str | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict[str, int] | None = None
    status: int = 200
    error: str | None = None
    delay: float = 0.0


Script = Callable[[dict[str, Any]], ScriptedReply] | Sequence[ScriptedReply]


class ToyChatTokens:
    """A deterministic stand-in for a chat template + tokenizer, for scripts that serve token ids.

    A message renders as ``[role marker] + body + [END]`` where the body is its text (and, for an
    assistant, each tool call's name and arguments) one token per character; a prompt is its
    messages followed by the assistant marker, and a reply's completion ids are its body + ``[END]``.
    So when a client sends back a reply verbatim, the next prompt's ids start with the previous
    prompt + completion ids, exactly as with vLLM and a real template. Reasoning is not rendered.
    """

    ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
    END, CALL, ARGS, CALL_END = 5, 6, 7, 8
    CHAR_BASE = 1000

    @classmethod
    def _chars(cls, text: str) -> list[int]:
        return [cls.CHAR_BASE + ord(c) for c in text]

    @classmethod
    def _body(cls, content: Any, tool_calls: Sequence[tuple[str, str]]) -> list[int]:
        ids = cls._chars(content_text(content))
        for name, arguments in tool_calls:
            ids += [cls.CALL, *cls._chars(name), cls.ARGS, *cls._chars(arguments), cls.CALL_END]
        return ids

    @classmethod
    def message_ids(cls, message: dict[str, Any]) -> list[int]:
        """The ids of one OpenAI-format message."""
        calls = [((c.get("function") or {}).get("name") or "", (c.get("function") or {}).get("arguments") or "")
                 for c in message.get("tool_calls") or []]
        return [cls.ROLES.get(message.get("role", ""), 9), *cls._body(message.get("content"), calls), cls.END]

    @classmethod
    def prompt_ids(cls, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The ids of a request's messages, ending with the assistant marker (the generation prompt)."""
        return [i for m in messages for i in cls.message_ids(m)] + [cls.ROLES["assistant"]]

    @classmethod
    def completion_ids(cls, reply: ScriptedReply) -> list[int]:
        """The ids a model would have sampled to produce ``reply``."""
        return [*cls._body(reply.content, [(c.name, c.arguments) for c in reply.tool_calls]), cls.END]

    @classmethod
    def wrap(cls, script: Callable[[dict[str, Any]], ScriptedReply]) -> Callable[[dict[str, Any]], ScriptedReply]:
        """A script whose replies carry these prompt and completion ids (unless the reply sets its own)."""

        def tokenized(body: dict[str, Any]) -> ScriptedReply:
            reply = script(body)
            return dataclasses.replace(
                reply,
                prompt_token_ids=reply.prompt_token_ids if reply.prompt_token_ids is not None
                else cls.prompt_ids(body.get("messages") or []),
                token_ids=reply.token_ids if reply.token_ids is not None else cls.completion_ids(reply))

        return tokenized


class _ScriptError(Exception):
    """The script could not produce a reply (exhausted or raised)."""


def _error_response(status: int, message: str) -> JSONResponse:
    """Build an OpenAI-style error body so clients raise their usual ``APIStatusError``."""
    err_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": err_type, "code": status}}, status_code=status)


def _pieces(text: str, n: int) -> list[str]:
    """Split ``text`` into at most ``n`` non-empty consecutive pieces."""
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(payload: dict[str, Any] | str) -> str:
    """Encode one Server-Sent Event ``data:`` line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class ScriptedOpenAIServer:
    """Serve ``/v1/chat/completions`` from a script on 127.0.0.1, in a background uvicorn thread.

    ``script`` is either a callable given the parsed request body (stateless, so safe under
    concurrency) or a sequence of replies served one per request in arrival order.
    """

    def __init__(self, script: Script | None = None, *, model: str = "scripted") -> None:
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._script: Script = script if script is not None else (lambda _body: ScriptedReply(content="ok"))
        self._lock = threading.Lock()
        self._cursor = 0
        self._call_ids = itertools.count(1)
        self._app = self._build_app()
        self._http = UvicornThread(self._app, name="scripted-openai", lifespan="off", timeout_graceful_shutdown=5)

    # ----------------------------------------------------------------- lifecycle
    @property
    def base_url(self) -> str:
        """OpenAI ``base_url`` for clients, e.g. ``http://127.0.0.1:PORT/v1``."""
        if self._http.port is None:
            raise RuntimeError("ScriptedOpenAIServer is not started")
        return f"http://127.0.0.1:{self._http.port}/v1"

    def start(self, timeout: float = 10.0) -> ScriptedOpenAIServer:
        """Bind a free port and run uvicorn in a daemon thread; return once it accepts requests."""
        self._http.start(timeout)
        logger.debug("scripted OpenAI server listening on %s", self.base_url)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and join its thread; safe to call twice."""
        self._http.stop(timeout=10)

    def clear(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self.requests.clear()

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ScriptedOpenAIServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # ----------------------------------------------------------------- app
    def _build_app(self) -> FastAPI:
        """Create the per-instance FastAPI app (no module-level state)."""
        app = FastAPI(title="scripted-openai")

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "rllm"}]}

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Any:
            try:
                body = await request.json()
            except ValueError:
                return _error_response(400, "request body is not valid JSON")
            if not isinstance(body, dict):
                return _error_response(400, "request body must be a JSON object")
            with self._lock:
                self.requests.append(body)
            try:
                reply = self._next_reply(body)
            except _ScriptError as exc:
                return _error_response(500, str(exc))
            if reply.delay > 0:
                await asyncio.sleep(reply.delay)
            if reply.status != 200 or reply.error is not None:
                status = 500 if reply.status == 200 else reply.status
                return _error_response(status, reply.error or f"scripted error (status {status})")
            reply = self._resolve(reply)
            if body.get("stream"):
                return StreamingResponse(self._stream(body, reply), media_type="text/event-stream")
            return JSONResponse(self._completion(body, reply))

        return app

    def _next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        """Ask the script for the reply to ``body``."""
        if callable(self._script):
            try:
                return self._script(body)
            except Exception as exc:  # surface script bugs to the client instead of a bare 500
                logger.exception("scripted reply callable raised")
                raise _ScriptError(f"script raised {type(exc).__name__}: {exc}") from exc
        with self._lock:
            index, self._cursor = self._cursor, self._cursor + 1
        if index >= len(self._script):
            raise _ScriptError(f"script exhausted: request #{index + 1} but only {len(self._script)} replies scripted")
        return self._script[index]

    def _resolve(self, reply: ScriptedReply) -> ScriptedReply:
        """Fill defaults: tool-call ids, finish_reason, token ids, logprobs and usage."""
        calls = [dataclasses.replace(c, id=c.id or f"call_{next(self._call_ids)}") for c in reply.tool_calls]
        prompt_ids = list(reply.prompt_token_ids) if reply.prompt_token_ids is not None else list(_SYNTH_PROMPT_IDS)
        token_ids = list(reply.token_ids) if reply.token_ids is not None else list(_SYNTH_TOKEN_IDS)
        usage = reply.usage or {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids),
                                "total_tokens": len(prompt_ids) + len(token_ids)}
        return dataclasses.replace(
            reply, tool_calls=calls, finish_reason=reply.finish_reason or ("tool_calls" if calls else "stop"),
            prompt_token_ids=prompt_ids, token_ids=token_ids, usage=usage,
            logprobs=list(reply.logprobs) if reply.logprobs is not None else [-0.1] * len(token_ids))

    @staticmethod
    def _logprobs(body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any] | None:
        """OpenAI ``choices[0].logprobs`` when the request asked for them, else ``None``."""
        if not body.get("logprobs"):
            return None
        entries: list[dict[str, Any]] = [{"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                                         for i, lp in enumerate(reply.logprobs or [])]
        return {"content": entries}

    def _completion(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        """Build a non-streamed ``chat.completion`` object."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.tool_calls]
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason,
                                  "logprobs": self._logprobs(body, reply)}
        out: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                               "created": int(time.time()), "model": self.model, "choices": [choice],
                               "usage": reply.usage}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = reply.prompt_token_ids
            choice["token_ids"] = reply.token_ids
        return out

    async def _stream(self, body: dict[str, Any], reply: ScriptedReply) -> AsyncIterator[str]:
        """Yield ``chat.completion.chunk`` SSE events, ending with ``data: [DONE]``.

        With ``return_token_ids`` the first chunk carries ``prompt_token_ids`` and the finish chunk
        ``token_ids``; requested logprobs ride on the finish chunk.
        """
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.model}

        def chunk(delta: dict[str, Any], **choice_extra: Any) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None, **choice_extra}
            return {**base, "choices": [choice]}

        first = chunk({"role": "assistant", "content": ""})
        if body.get("return_token_ids"):
            first["prompt_token_ids"] = reply.prompt_token_ids
        yield _sse(first)
        if reply.reasoning_content:
            yield _sse(chunk({"reasoning_content": reply.reasoning_content}))
        for piece in _pieces(reply.content or "", 3):
            yield _sse(chunk({"content": piece}))
        for index, call in enumerate(reply.tool_calls):
            yield _sse(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]}))
            for piece in _pieces(call.arguments, 2):
                yield _sse(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        extra: dict[str, Any] = {"finish_reason": reply.finish_reason, "logprobs": self._logprobs(body, reply)}
        if body.get("return_token_ids"):
            extra["token_ids"] = reply.token_ids
        yield _sse(chunk({}, **extra))
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _sse({**base, "choices": [], "usage": reply.usage})
        yield _sse("[DONE]")
