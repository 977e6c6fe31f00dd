"""``TraceCapture``: the LiteLLM callback that tags, routes and records every proxied call.

- ``async_pre_call_hook`` (once per client request): reads the ``x-rllm-session`` header, gives
  the call the session's next sequence number, and puts both in the request metadata. A request
  without the header goes under ``no-session`` with a warning; a malformed id is refused (400).
- ``async_filter_deployments``: sticky routing. Each session always goes to the same healthy
  backend (rendezvous hashing of session id and deployment id), so the backend's prefix cache
  holds the rollout's growing prompt; losing a backend moves only that backend's sessions.
- ``async_log_success_event`` / ``async_log_failure_event``: records calls that the
  ``rllm_vllm`` provider did not already capture (e.g. ``openai/`` backends). The success event
  fires for streamed calls too, once, with the assembled response; LiteLLM drops token ids and
  logprobs from assembled streams, which is why vLLM backends go through ``rllm_vllm``.

Runs only inside the proxy's environment (imports ``litellm``).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from typing import Any

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from rllm.tracing.backend import CAPTURED_KEY, rllm_metadata
from rllm.tracing.records import make_trace
from rllm.tracing.session import NO_SESSION, SESSION_HEADER, is_valid_session_id
from rllm.tracing.store import TraceStore

logger = logging.getLogger("rllm.tracing.capture")

_CHAT_CALLS = frozenset({"completion", "acompletion"})


def _header(data: dict[str, Any], name: str) -> str | None:
    proxy_request = data.get("proxy_server_request") or {}
    for holder in (proxy_request.get("headers"), (data.get("metadata") or {}).get("headers")):
        if isinstance(holder, dict):
            for key, value in holder.items():
                if key.lower() == name:
                    return str(value)
    return None


def _rendezvous(session_id: str, deployment: dict[str, Any]) -> bytes:
    deployment_id = str((deployment.get("model_info") or {}).get("id") or deployment.get("litellm_params", {}))
    return hashlib.blake2b(f"{session_id}\x00{deployment_id}".encode(), digest_size=8).digest()


class TraceCapture(CustomLogger):
    """Session tagging, sticky routing and fallback capture for the LiteLLM proxy.

    Args:
        store: Where traces go.
        sticky: Route each session to one backend.
        max_sessions: Sessions whose next sequence number is kept in memory (older ones are re-read
            from the store when they come back).
    """

    def __init__(self, store: TraceStore, *, sticky: bool = True, max_sessions: int = 100_000) -> None:
        super().__init__()
        self.store = store
        self.sticky = sticky
        self._max_sessions = max_sessions
        self._next_seq: collections.OrderedDict[str, int] = collections.OrderedDict()

    def _take_seq(self, session_id: str) -> int:
        seq = self._next_seq.pop(session_id, None)
        if seq is None:
            seq = self.store.max_seq(session_id) + 1
        self._next_seq[session_id] = seq + 1
        if len(self._next_seq) > self._max_sessions:
            self._next_seq.popitem(last=False)
        return seq

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        if str(getattr(call_type, "value", call_type)) not in _CHAT_CALLS:
            return data
        session_id = _header(data, SESSION_HEADER)
        no_session = session_id is None
        if session_id is None:
            logger.warning("request without an %s header: stored under session %r", SESSION_HEADER, NO_SESSION)
            session_id = NO_SESSION
        elif not is_valid_session_id(session_id):
            raise HTTPException(status_code=400, detail=f"invalid {SESSION_HEADER} header {session_id[:200]!r}: "
                                                        "use 1-128 characters of [A-Za-z0-9._:-]")
        meta = data.setdefault("metadata", {})
        meta["rllm"] = {"session_id": session_id, "seq": self._take_seq(session_id), "no_session": no_session,
                        "received_at": time.time()}
        return data

    async def async_filter_deployments(self, model: str, healthy_deployments: list, messages: Any,
                                       request_kwargs: dict | None = None, parent_otel_span: Any = None) -> list:
        if not self.sticky or len(healthy_deployments) <= 1:
            return healthy_deployments
        session_id = rllm_metadata(request_kwargs).get("session_id")
        if not session_id or session_id == NO_SESSION:
            return healthy_deployments
        return [max(healthy_deployments, key=lambda d: _rendezvous(session_id, d))]

    def _trace(self, kwargs: dict, response: Any, start_time: Any, error: dict | None) -> dict:
        meta = rllm_metadata(kwargs)
        params = {**(kwargs.get("optional_params") or {}), "messages": kwargs.get("messages") or []}
        raw = response.model_dump() if hasattr(response, "model_dump") else response
        started = start_time.timestamp() if hasattr(start_time, "timestamp") else time.time()
        return make_trace(session_id=meta.get("session_id") or NO_SESSION, seq=int(meta.get("seq", -1)),
                          no_session=bool(meta.get("no_session", not meta)), model=kwargs.get("model"),
                          backend=(kwargs.get("litellm_params") or {}).get("api_base"), params=params,
                          stream=bool(kwargs.get("stream")), started_at=started,
                          raw_response=raw if error is None and isinstance(raw, dict) else None, error=error)

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        if kwargs.get(CAPTURED_KEY) or kwargs.get("call_type") not in _CHAT_CALLS:
            return
        await self.store.aput(self._trace(kwargs, response_obj, start_time, None), wait=False)

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        if kwargs.get(CAPTURED_KEY) or kwargs.get("call_type") not in _CHAT_CALLS:
            return
        exc = kwargs.get("exception")
        error = {"type": type(exc).__name__ if exc else "error", "status": getattr(exc, "status_code", None),
                 "message": str(exc)[:2000] if exc else "unknown error"}
        await self.store.aput(self._trace(kwargs, None, start_time, error), wait=False)
