"""What the ``PolicyServer`` accepts: a validated chat request, a bounded body, and the sampling the trainer owns.

A malformed field is a 400 naming it (never a 500 the client would retry as infrastructure), a
body past the size limit a 413 answered before it is read in full, a body that does not arrive in
time a 408, as the retrieval server (``rag.server``) answers them. Sampling keys a client sends
(``OpenAIModel(params={"temperature": ...})``) are not the engine's: the trainer samples, and
rollout log-probs must come from the distribution the actor scores (``TRAINER_OWNED``); ``IgnoredSampling``
says so once, here and on ``RLLMModel`` (a factory's ``params`` in training).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import JSONResponse

TRAINER_OWNED = frozenset({
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "seed",
    "stop", "logit_bias", "min_tokens", "reasoning_effort", "chat_template_kwargs", "skip_special_tokens",
    "include_stop_str_in_output",
})
"""Request keys that would change how the policy samples or renders: ignored, the trainer's settings stay."""


def trainer_owned(params: Mapping[str, Any]) -> list[str]:
    """The trainer-owned sampling keys ``params`` sets (``TRAINER_OWNED``; a ``None`` value sets nothing), sorted."""
    return sorted(k for k in TRAINER_OWNED if params.get(k) is not None)


class IgnoredSampling:
    """The trainer-owned sampling keys a caller set, and the one warning that says they are ignored.

    The policy server keeps one per server (its clients' requests), ``RLLMModel`` one per process (a
    factory's ``params`` in training): the first keys are warned about, later ones only recorded.

    Args:
        who: What ignores them, as the warning starts ("the policy server ignores the sampling its clients send").
    """

    def __init__(self, who: str) -> None:
        self.who = who
        self.keys: set[str] = set()
        self._lock = threading.Lock()

    def note(self, keys: Iterable[str], log: logging.Logger) -> None:
        """Record ``keys``; the first time any are recorded, warn on ``log`` naming them."""
        with self._lock:
            new = set(keys) - self.keys
            first = bool(new) and not self.keys
            self.keys |= new
        if first:
            log.warning("%s (%s): the trainer samples, and rollout log-probs must come from the distribution the actor "
                        "scores; your factory's params stay as they are for evaluation (this warning is given once)",
                        self.who, ", ".join(sorted(new)))

_Number = Annotated[float, Field(allow_inf_nan=False)]
_Count = Annotated[int, Field(ge=1)]


class _StrictModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ChatMessage(_StrictModel):
    """One message: a role and its content (text, parts, or none for an assistant's tool calls)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(_StrictModel):
    """``stream_options``: whether the last chunk carries the usage."""

    include_usage: bool | None = None


class ChatRequest(_StrictModel):
    """A ``/v1/chat/completions`` body as the policy server serves it (unknown keys are let through, unused)."""

    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = None
    max_tokens: _Count | None = None
    max_completion_tokens: _Count | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    temperature: _Number | None = None
    top_p: _Number | None = None
    top_k: int | None = None
    min_p: _Number | None = None
    frequency_penalty: _Number | None = None
    presence_penalty: _Number | None = None
    repetition_penalty: _Number | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, _Number] | None = None

    def cap(self) -> int | None:
        """The request's own cap on sampled tokens (``max_completion_tokens`` wins, as OpenAI reads them)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def owned_by_trainer(self, sent: dict[str, Any]) -> list[str]:
        """The trainer-owned sampling keys this request sets (``sent`` is the body as received)."""
        return trainer_owned(sent)

    def unservable(self) -> str | None:
        """Why the engine cannot honour this request at all, or ``None``."""
        if self.response_format is not None and self.response_format.get("type", "text") != "text":
            return (f"response_format {self.response_format.get('type')!r} cannot be honoured: the policy samples "
                    "free text and tool calls in its chat template's format")
        return None


def explain(error: ValidationError) -> str:
    """One readable line naming every field that failed validation."""
    parts = []
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return f"the request body is not JSON: {e.get('ctx', {}).get('error', e['msg'])}"
        loc = ".".join(str(part) for part in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "invalid request: " + "; ".join(parts)


def error_response(status: int, message: str, *, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An error as OpenAI-compatible servers write it (``invalid_request_error`` below 500)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status,
                        headers=headers)


Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _BodyTooLarge(Exception):
    pass


class _BodyLate(Exception):
    pass


async def _drain(receive: Receive, deadline: float) -> None:
    """Discard the rest of a refused body as it arrives, up to ``_DRAIN_BYTES`` and the deadline."""
    drained = 0
    while drained <= _DRAIN_BYTES:
        try:
            message = await _before(receive(), deadline)
        except asyncio.TimeoutError:
            return
        drained += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _before(waited: Awaitable[Message], deadline: float) -> Message:
    """``waited``, or ``asyncio.TimeoutError`` at the loop time ``deadline`` (``asyncio.timeout_at`` needs 3.11)."""
    return await asyncio.wait_for(waited, max(0.0, deadline - asyncio.get_running_loop().time()))


async def read_body(request: Any, limit: BodyLimit) -> bytes | JSONResponse:
    """The request's body, or the 413 or 408 its reading ended with (``BodyLimit`` counts it as it arrives)."""
    try:
        return bytes(await request.body())
    except _BodyTooLarge:
        return limit.too_large("exceeds the limit")
    except _BodyLate:
        return limit.late()


_DRAIN_BYTES = 256 * 1024 * 1024
"""Most bytes of a refused body discarded so its client reads the 413 (past it the connection is reset)."""


class BodyLimit:
    """ASGI wrapper: a request body over ``max_bytes`` is a 413 before it is parsed or kept, a late one a 408.

    A declared ``content-length`` over the limit is refused before any of it is kept; a chunked body
    is counted while it arrives and refused at the first chunk past the limit. What the client still
    sends of a refused body is discarded as it arrives (up to ``_DRAIN_BYTES``, within the deadline),
    never stored: a server that closed on it would reset the connection, and the client would take
    the reset for infrastructure and retry instead of reading the 413. The body must arrive within
    ``timeout_s`` of the request's head.
    """

    def __init__(self, app: Any, *, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error_response(400, "the content-length header is not a number")(scope, receive, send)
                return
        seen, done, started = 0, False, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        if declared is not None and int(declared) > self.max_bytes:
            await _drain(receive, deadline)
            await self.too_large(f"is {int(declared)} bytes")(scope, receive, send)
            return

        async def bounded_receive() -> Message:
            nonlocal seen, done
            if done:  # after the body only a disconnect comes: no deadline for it
                return await receive()
            try:
                message = await _before(receive(), deadline)
            except asyncio.TimeoutError:
                raise _BodyLate from None
            seen += len(message.get("body", b""))
            done = message["type"] != "http.request" or not message.get("more_body", False)
            if seen > self.max_bytes:
                if not done:
                    await _drain(receive, deadline)
                raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracked_send)
        except _BodyTooLarge:
            if not started:
                await self.too_large("exceeds the limit")(scope, receive, send)
        except _BodyLate:
            if not started:
                await self.late()(scope, receive, send)

    def too_large(self, what: str) -> JSONResponse:
        message = f"the request body {what}; the policy server's limit is {self.max_bytes} bytes (max_body_bytes)"
        return error_response(413, message, code="request_too_large", headers={"Connection": "close"})

    def late(self) -> JSONResponse:
        return error_response(408, f"the request body did not arrive within {self.timeout_s:g} s",
                              headers={"Connection": "close"})
