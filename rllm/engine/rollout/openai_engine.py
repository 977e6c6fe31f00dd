"""Rollout engine for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, LiteLLM, hosted).

One connection pool per event loop (an httpx pool cannot cross loops, and Strands' synchronous
``Agent.__call__`` runs each call on a fresh loop), a per-request timeout, and retries with capped,
jittered exponential backoff on 429, 5xx and connection errors only. Against vLLM it asks for the
prompt and completion token ids and the logprobs, so the output can be trained on.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai

from rllm.engine.rollout.base import (
    ContextLengthExceededError,
    EngineError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    GenerationAbortedError,
    mentions_context_overflow,
    select_sampling_params,
)
from rllm.retry import PerLoop, backoff_retrying
from rllm.types import ModelOutput, ToolCall

logger = logging.getLogger(__name__)

_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _is_retryable(error: BaseException) -> bool:
    """429, 5xx, timeouts and connection failures are worth another try; other 4xx are not."""
    if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code == 429 or error.status_code >= 500
    return False


def _describe(error: BaseException) -> str:
    if isinstance(error, openai.APITimeoutError):
        return "request timed out"
    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {error.message}"
    if isinstance(error, openai.APIConnectionError):
        return f"connection failed: {error.__cause__ or error}"
    return f"{type(error).__name__}: {error}"


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
        self._clients: PerLoop[openai.AsyncOpenAI] = PerLoop(self._new_client)

    @property
    def url(self) -> str:
        """The chat-completions URL, as named in errors."""
        return f"{self.base_url}/chat/completions"

    def _new_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=0,  # retries are ours: capped, jittered, and only for retryable errors
            http_client=openai.DefaultAsyncHttpxClient(
                # newer openai types its default client on httpx2, which reads httpx's Limits as they are
                limits=httpx.Limits(  # type: ignore[arg-type]
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                )
            ),
        )

    async def close(self) -> None:
        """Close the running loop's connection pool."""
        client = self._clients.pop()
        if client is not None:
            await client.close()

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
        retrying = backoff_retrying(
            self.url,
            max_retries=self.max_retries,
            backoff_initial=self.backoff_initial,
            backoff_max=self.backoff_max,
            retryable=_is_retryable,
            describe=_describe,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._clients.get().chat.completions.create(**request)
        except openai.APIError as error:
            raise self._translate(error) from error
        if not response.choices:
            raise EngineRequestError(f"{self.url} returned no choices", url=self.url, cause="no choices")
        return parse_chat_completion(response)

    def _translate(self, error: openai.APIError) -> EngineError:
        cause = _describe(error)
        if isinstance(error, openai.APIStatusError) and error.status_code == 429:
            message = f"{self.url} kept throttling (429) after {self.max_retries + 1} attempts: {cause}"
            return EngineThrottledError(message, url=self.url, cause=cause)
        if _is_retryable(error):
            message = f"{self.url} failed after {self.max_retries + 1} attempts: {cause}"
            return EngineUnavailableError(message, url=self.url, cause=cause)
        if is_context_overflow(error):
            return ContextLengthExceededError(
                f"{self.url}: context window exceeded: {cause}", url=self.url, cause=cause
            )
        return EngineRequestError(f"{self.url} rejected the request: {cause}", url=self.url, cause=cause)


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
