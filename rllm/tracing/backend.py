"""The ``rllm_vllm`` LiteLLM provider: OpenAI-compatible backends with exact token capture.

LiteLLM keeps vLLM's ``prompt_token_ids`` and ``choices[0].token_ids`` on non-streamed responses
but drops them (and the logprobs) when it assembles a streamed one, so a success-log callback
cannot capture streamed calls exactly. This provider (a LiteLLM ``CustomLLM``) therefore makes
every upstream call non-streamed, asks vLLM for ``return_token_ids`` and ``logprobs``, writes
the trace to the store and waits for the commit, and only then answers: a plain completion, or
the same completion replayed as a stream. So a trace is durable before the client sees the
reply, and a streamed call is captured exactly like a non-streamed one. The price: a streamed
reply arrives all at once, after the whole generation.

Routing, retries and cool-downs stay LiteLLM's (one ``model_list`` entry per backend). Runs only
inside the proxy's environment (imports ``litellm``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from litellm import CustomLLM, ModelResponse
from litellm.llms.custom_llm import CustomLLMError
from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices, Usage

from rllm.tracing.records import make_trace
from rllm.tracing.session import NO_SESSION
from rllm.tracing.store import TraceStore
from rllm.transport import open_client

logger = logging.getLogger(__name__)

CAPTURED_KEY = "rllm_captured"
_DEFAULT_TIMEOUT_S = 600.0
_NOT_FORWARDED = frozenset({"stream", "stream_options", "extra_body", "max_retries", "extra_headers", "metadata"})


def rllm_metadata(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``{"session_id", "seq", "no_session"}`` the capture callback attached to a request."""
    for holder in (kwargs or {}, (kwargs or {}).get("litellm_params") or {}):
        for key in ("metadata", "litellm_metadata"):
            meta = holder.get(key) or {}
            if isinstance(meta, Mapping) and isinstance(meta.get("rllm"), Mapping):
                return dict(meta["rllm"])
    return {}


def _upstream_body(model: str, messages: list[Any], optional_params: Mapping[str, Any], *,
                   token_ids: bool, logprobs: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages}
    body.update({k: v for k, v in optional_params.items() if k not in _NOT_FORWARDED})
    body.update(optional_params.get("extra_body") or {})
    body["stream"] = False
    if token_ids:
        body["return_token_ids"] = True
    if logprobs and not body.get("logprobs"):
        body["logprobs"] = True
    return body


def _stream_chunks(raw: Mapping[str, Any]) -> list[ModelResponseStream]:
    """Replay a completion as stream chunks: text (and reasoning), then each tool call.

    The last chunk carries the finish reason and usage.
    """
    choice = (raw.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    base = {"id": raw.get("id"), "created": raw.get("created") or int(time.time()), "model": raw.get("model")}
    deltas: list[Delta] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if message.get("content") or reasoning or not message.get("tool_calls"):
        deltas.append(Delta(role="assistant", content=message.get("content") or "", reasoning_content=reasoning))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        deltas.append(Delta(role=None if deltas else "assistant", tool_calls=[{
            "index": index, "id": call.get("id"), "type": "function",
            "function": {"name": function.get("name"), "arguments": function.get("arguments") or ""}}]))
    chunks = []
    for i, delta in enumerate(deltas):
        last = i == len(deltas) - 1
        extra: dict[str, Any] = {}
        if last and raw.get("usage"):
            usage = raw["usage"]
            extra["usage"] = Usage(prompt_tokens=usage.get("prompt_tokens", 0),
                                   completion_tokens=usage.get("completion_tokens", 0),
                                   total_tokens=usage.get("total_tokens", 0))
        chunks.append(ModelResponseStream(
            choices=[StreamingChoices(index=0, delta=delta,
                                      finish_reason=(choice.get("finish_reason") or "stop") if last else None)],
            **base, **extra))
    return chunks


class TokenIdBackend(CustomLLM):
    """Call an OpenAI-compatible backend non-streamed, capture the exact reply, then answer.

    Args:
        store: Where traces go; ``None`` turns capture off (the benchmark's baseline).
        token_ids: Ask for vLLM's ``return_token_ids`` (turn off for servers that reject it).
        logprobs: Ask for per-token logprobs of the sampled tokens.
    """

    def __init__(self, store: TraceStore | None, *, token_ids: bool = True, logprobs: bool = True,
                 max_connections: int = 1024) -> None:
        super().__init__()
        self._store = store
        self._token_ids = token_ids
        self._logprobs = logprobs
        self._max_connections = max_connections
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            # Every request passes its own timeout (LiteLLM's, else _DEFAULT_TIMEOUT_S), which replaces this one.
            entry = (loop, open_client(timeout=_DEFAULT_TIMEOUT_S, max_connections=self._max_connections))
            self._clients[id(loop)] = entry
        return entry[1]

    async def _call(self, *, model: str, messages: list[Any], api_base: str | None, api_key: str | None,
                    optional_params: Mapping[str, Any], litellm_params: Mapping[str, Any] | None,
                    logging_obj: Any, timeout: Any, stream: bool) -> dict[str, Any]:
        if not api_base:
            raise CustomLLMError(status_code=500, message=f"rllm_vllm model {model!r} has no api_base")
        meta = rllm_metadata({"litellm_params": litellm_params or {}})
        body = _upstream_body(model, messages, optional_params, token_ids=self._token_ids, logprobs=self._logprobs)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = api_base.rstrip("/") + "/chat/completions"
        started = time.time()
        raw: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        try:
            response = await self._client().post(url, json=body, headers=headers,
                                                 timeout=timeout if timeout is not None else _DEFAULT_TIMEOUT_S)
            if response.status_code >= 400:
                error = {"type": "upstream_status", "status": response.status_code, "message": _error_text(response)}
            else:
                raw = response.json()
        except httpx.TimeoutException as exc:
            error = {"type": "timeout", "status": 408, "message": f"{url} timed out: {exc}"}
        except httpx.HTTPError as exc:
            error = {"type": "connection", "status": 503, "message": f"{url} unreachable: {type(exc).__name__}: {exc}"}
        except ValueError as exc:
            error = {"type": "bad_response", "status": 502, "message": f"{url} returned invalid JSON: {exc}"}
        if self._store is not None:
            trace = make_trace(session_id=meta.get("session_id") or NO_SESSION, seq=int(meta.get("seq", -1)),
                               no_session=bool(meta.get("no_session", not meta)), model=model, backend=api_base,
                               params={"messages": messages, **optional_params}, stream=stream,
                               started_at=started, raw_response=raw, error=error)
            try:
                await self._store.aput(trace, wait=True)
            except Exception as exc:
                raise CustomLLMError(status_code=500, message=f"rllm trace store write failed: {exc}") from exc
            if logging_obj is not None:
                logging_obj.model_call_details[CAPTURED_KEY] = trace["trace_id"]
        if error is not None:
            raise CustomLLMError(status_code=error["status"], message=error["message"])
        assert raw is not None
        return raw

    async def acompletion(self, model: str, messages: list, api_base: str, custom_prompt_dict: dict,
                          model_response: ModelResponse, print_verbose: Any, encoding: Any, api_key: Any,
                          logging_obj: Any, optional_params: dict, acompletion: Any = None, litellm_params: Any = None,
                          logger_fn: Any = None, headers: Any = None, timeout: Any = None, client: Any = None,
                          ) -> ModelResponse:
        raw = await self._call(model=model, messages=messages, api_base=api_base, api_key=api_key,
                               optional_params=optional_params, litellm_params=litellm_params,
                               logging_obj=logging_obj, timeout=timeout, stream=False)
        return ModelResponse(**raw)

    async def astreaming(self, model: str, messages: list, api_base: str, custom_prompt_dict: dict,
                         model_response: ModelResponse, print_verbose: Any, encoding: Any, api_key: Any,
                         logging_obj: Any, optional_params: dict, acompletion: Any = None, litellm_params: Any = None,
                         logger_fn: Any = None, headers: Any = None, timeout: Any = None, client: Any = None,
                         ) -> AsyncIterator[ModelResponseStream]:
        raw = await self._call(model=model, messages=messages, api_base=api_base, api_key=api_key,
                               optional_params=optional_params, litellm_params=litellm_params,
                               logging_obj=logging_obj, timeout=timeout, stream=True)
        for chunk in _stream_chunks(raw):
            yield chunk

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise CustomLLMError(status_code=501, message="rllm_vllm serves async calls only (run it behind the proxy)")

    def streaming(self, *args: Any, **kwargs: Any) -> Any:
        raise CustomLLMError(status_code=501, message="rllm_vllm serves async calls only (run it behind the proxy)")


def _error_text(response: httpx.Response) -> str:
    """The backend's error message (OpenAI ``{"error": {"message"}}`` or the raw text)."""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
            return str(body["error"]["message"])
        return json.dumps(body)[:2000]
    except ValueError:
        return response.text[:2000] or f"HTTP {response.status_code}"
