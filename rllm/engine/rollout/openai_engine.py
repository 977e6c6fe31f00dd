"""Rollout engine for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, LiteLLM, hosted).

Requests go through ``rllm.transport``: one connection pool per event loop (an httpx pool cannot
cross loops, and Strands' synchronous ``Agent.__call__`` runs each call on a fresh loop), a
per-request timeout, and retries with capped, jittered exponential backoff on 429, 5xx and
connection errors only; what still fails raises the engine error ``engine_error`` names. Against
vLLM it asks for the prompt and completion token ids and the logprobs, so the output can be trained on.
"""

from __future__ import annotations

import logging
from typing import Any

from openai.types.chat import ChatCompletion

from rllm.engine.rollout.base import mentions_context_overflow, select_sampling_params
from rllm.engine.rollout.http import engine_error
from rllm.errors import EngineRequestError, GenerationAbortedError
from rllm.transport import HTTPTransport
from rllm.types import ModelOutput, ToolCall

logger = logging.getLogger(__name__)

_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def is_context_overflow(error: BaseException) -> bool:
    """Whether an OpenAI-style error says the prompt does not fit the context window."""
    return getattr(error, "code", None) == "context_length_exceeded" or mentions_context_overflow(str(error))


class OpenAIEngine:
    """A ``RolloutEngine`` over ``/v1/chat/completions``.

    Args:
        model: Model name sent with every request.
        base_url: Endpoint root, e.g. ``http://127.0.0.1:30000/v1``.
        api_key: Sent as a bearer token; servers that ignore it accept any value.
        timeout: Seconds one HTTP request may take before it counts as failed (and is retried).
        max_retries: Retries after the first attempt for retryable failures.
        backoff_initial: First backoff in seconds; doubles each retry, jittered.
        backoff_max: Cap on one backoff, in seconds.
        return_token_ids: Ask the server (vLLM) for prompt and completion token ids.
        logprobs: Ask for per-token logprobs; defaults to ``return_token_ids``.
        max_connections: Size of the connection pool per event loop.
        **sampling: Default sampling parameters (temperature, max_tokens, ...).
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str = "EMPTY",
        *,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        return_token_ids: bool = False,
        logprobs: bool | None = None,
        max_connections: int = 1024,
        **sampling: Any,
    ) -> None:
        defaults, dropped = select_sampling_params(sampling)
        if dropped:
            raise TypeError(f"OpenAIEngine: unknown sampling parameters {dropped}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.return_token_ids = return_token_ids
        self.logprobs = return_token_ids if logprobs is None else logprobs
        self.max_connections = max_connections
        self.default_sampling = defaults
        self._transport = HTTPTransport(
            self.base_url, engine_error, timeout=timeout, max_retries=max_retries, backoff_initial=backoff_initial,
            backoff_max=backoff_max, max_connections=max_connections, headers={"Authorization": f"Bearer {api_key}"},
        )

    @property
    def url(self) -> str:
        """The chat-completions URL, as named in errors."""
        return f"{self.base_url}/chat/completions"

    async def close(self) -> None:
        """Close the running loop's connection pool."""
        await self._transport.aclose()

    def build_request(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> dict[str, Any]:
        """The request body: allowed sampling parameters only, plus the token-id extensions."""
        params, dropped = select_sampling_params({**self.default_sampling, **sampling})
        if dropped:
            logger.debug("dropped non-sampling keywords %s", dropped)
        request: dict[str, Any] = {"model": self.model, "messages": messages, **params}
        if tools:
            request["tools"] = tools
        else:
            request.pop("tool_choice", None)
        extra_body: dict[str, Any] = {}
        if self.return_token_ids:
            extra_body["return_token_ids"] = True
        if self.logprobs:
            request["logprobs"] = True
            request.setdefault("top_logprobs", 0)
        if extra_body:
            request["extra_body"] = extra_body
        return request

    async def get_model_response(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ModelOutput:
        """Send one chat completion, retrying infrastructure failures, and parse the answer."""
        request = self.build_request(messages, tools, **sampling)
        body = {key: value for key, value in request.items() if key != "extra_body"}
        body.update(request.get("extra_body", {}))  # on the wire the extensions sit beside the standard fields
        answer = await self._transport.request_json("POST", "/chat/completions", json=body)
        # construct, as the openai SDK reads an answer: nested models built, nothing validated, extras kept
        response = ChatCompletion.construct(**answer) if isinstance(answer, dict) else None
        if response is None or not response.choices:
            raise EngineRequestError(f"{self.url} returned no choices", url=self.url, cause="no choices")
        return parse_chat_completion(response)


def parse_chat_completion(response: Any) -> ModelOutput:
    """A ``ModelOutput`` from a ChatCompletion, with vLLM's token ids and the logprobs when present.

    A choice the server cut (finish reason ``abort``, as vLLM and SGLang report an aborted request)
    raises ``GenerationAbortedError`` before its message is read, so no tool call in it runs.
    """
    if not response.choices:
        return ModelOutput()
    choice = response.choices[0]
    if choice.finish_reason == "abort":
        raise GenerationAbortedError(
            f"the server aborted chat completion {getattr(response, 'id', '?')} (finish reason abort); "
            "the cut answer is not parsed, run or trained",
            cause="abort",
        )
    message = choice.message
    reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
    logprobs = None
    if choice.logprobs is not None and choice.logprobs.content is not None:
        logprobs = [entry.logprob for entry in choice.logprobs.content]
    usage = response.usage.model_dump() if response.usage else {}
    return ModelOutput(
        text=message.content or "",
        reasoning=reasoning or None,
        tool_calls=[
            ToolCall.from_arguments(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or []
        ],
        prompt_ids=getattr(response, "prompt_token_ids", None),
        completion_ids=getattr(choice, "token_ids", None),
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
        usage={k: v for k, v in usage.items() if k in _USAGE_KEYS and isinstance(v, int)},
    )
