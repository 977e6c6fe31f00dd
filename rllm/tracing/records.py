"""The trace record: what one captured model call looks like in the store.

A trace is a JSON object::

    {"trace_id", "session_id", "seq", "no_session", "created_at", "latency_ms", "model", "backend",
     "request": {"messages", "tools", "tool_choice", "sampling", "stream"},
     "response": {"id", "message", "finish_reason", "prompt_token_ids", "completion_token_ids",
                  "logprobs", "usage"} | null,
     "error": {"type", "status", "message"} | null}

``response`` fields come from the backend's own JSON (vLLM's ``prompt_token_ids`` and
``choices[0].token_ids``, OpenAI logprobs), never from re-rendered text. Standard library only:
this module runs inside the proxy's environment.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

# Request keys that are not sampling parameters (everything else the client sent is kept as one).
_NOT_SAMPLING = frozenset({
    "messages", "model", "tools", "tool_choice", "stream", "stream_options", "extra_body", "extra_headers",
    "metadata", "max_retries", "return_token_ids", "user", "functions", "function_call", "api_key", "api_base",
})


def sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling parameters of a request (temperature, top_p, max_tokens, stop, seed, top_k...)."""
    out = {k: v for k, v in params.items() if k not in _NOT_SAMPLING and v is not None}
    out.update({k: v for k, v in (params.get("extra_body") or {}).items() if k not in _NOT_SAMPLING})
    return out


def _message(raw_message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message: role, content, reasoning and tool calls as the backend sent them."""
    message: dict[str, Any] = {"role": raw_message.get("role") or "assistant", "content": raw_message.get("content")}
    reasoning = raw_message.get("reasoning_content") or raw_message.get("reasoning")
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = raw_message.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type") or "function",
             "function": {"name": (c.get("function") or {}).get("name"),
                          "arguments": (c.get("function") or {}).get("arguments")}}
            for c in calls]
    return message


def response_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Pick a chat completion's message, token ids, logprobs and usage from its JSON body.

    Token ids are read where vLLM puts them (top-level ``prompt_token_ids``, ``choices[0].token_ids``)
    and where LiteLLM moves them (``choices[0].provider_specific_fields.token_ids``).
    """
    choices = raw.get("choices") or [{}]
    choice = choices[0] or {}
    provider = choice.get("provider_specific_fields") or {}
    prompt_ids = raw.get("prompt_token_ids") or choice.get("prompt_token_ids") or provider.get("prompt_token_ids")
    completion_ids = choice.get("token_ids") or provider.get("token_ids")
    logprob_entries = ((choice.get("logprobs") or {}).get("content")) or None
    logprobs = [float(e["logprob"]) for e in logprob_entries] if logprob_entries else None
    return {
        "id": raw.get("id"),
        "message": _message(choice.get("message") or {}),
        "finish_reason": choice.get("finish_reason"),
        "prompt_token_ids": list(prompt_ids) if prompt_ids is not None else None,
        "completion_token_ids": list(completion_ids) if completion_ids is not None else None,
        "logprobs": logprobs,
        "usage": {k: v for k, v in (raw.get("usage") or {}).items() if isinstance(v, int)},
    }


def make_trace(*, session_id: str, seq: int, no_session: bool, model: str | None, backend: str | None,
               params: Mapping[str, Any], stream: bool, started_at: float, raw_response: Mapping[str, Any] | None,
               error: Mapping[str, Any] | None = None, finished_at: float | None = None) -> dict[str, Any]:
    """Assemble one trace from the request parameters and the backend's JSON response (or error)."""
    finished_at = finished_at if finished_at is not None else time.time()
    return {
        "trace_id": uuid.uuid4().hex,
        "session_id": session_id,
        "seq": seq,
        "no_session": no_session,
        "created_at": finished_at,
        "latency_ms": round((finished_at - started_at) * 1000.0, 3),
        "model": model,
        "backend": backend,
        "request": {
            "messages": list(params.get("messages") or []),
            "tools": list(params.get("tools") or []),
            "tool_choice": params.get("tool_choice"),
            "sampling": sampling_params(params),
            "stream": stream,
        },
        "response": response_fields(raw_response) if raw_response is not None else None,
        "error": dict(error) if error is not None else None,
    }
