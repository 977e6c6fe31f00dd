"""``NonStreamingOpenAIModel``: Strands' ``OpenAIModel`` that never streams.

A LiteLLM proxy's post-call success hook fires only for non-streamed calls, so agents whose calls
are traced through such a proxy need every request sent with ``stream: false``. The answer is
replayed as the same Strands event sequence a streamed call produces, and the call is recorded
for ``StrandsAgent`` like ``RLLMModel``'s, token ids and logprobs included when the server sends
them, and a call whose arguments are not a JSON object never runs, as with ``RLLMModel``. A set
``cancel_signal`` aborts the HTTP request in flight, as with ``RLLMModel``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

import openai
from strands.agent.agent_metadata import AgentMetadata
from strands.models.openai import OpenAIModel
from strands.types.content import Messages, SystemContentBlock
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolChoice, ToolSpec
from typing_extensions import Unpack, override

from rllm.engine.rollout.openai_engine import is_context_overflow, parse_chat_completion
from rllm.errors import EngineUnavailableError
from rllm.integrations.strands._cancel import cancelled_output, unless_cancelled
from rllm.integrations.strands._format import format_messages, output_events
from rllm.integrations.strands.hooks import MalformedCallGuard
from rllm.integrations.strands.run_state import ModelCall, record_model_call

logger = logging.getLogger(__name__)


class NonStreamingOpenAIModel(OpenAIModel):
    """An ``OpenAIModel`` whose requests always carry ``stream: false``."""

    def __init__(self, *args: Any, **model_config: Unpack[OpenAIModel.OpenAIConfig]) -> None:
        model_config["stream"] = False
        super().__init__(*args, **model_config)
        self._guard = MalformedCallGuard()

    @override
    def update_config(self, **model_config: Unpack[OpenAIModel.OpenAIConfig]) -> None:  # type: ignore[override]
        """Update the configuration; ``stream`` stays off."""
        if model_config.get("stream"):
            raise ValueError("NonStreamingOpenAIModel never streams; use OpenAIModel for stream=True")
        super().update_config(**model_config)

    @classmethod
    @override
    def format_request_messages(
        cls,
        messages: Messages,
        system_prompt: str | None = None,
        *,
        system_prompt_content: list[SystemContentBlock] | None = None,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Same conversion as ``RLLMModel``: reasoning and tool-error status kept."""
        return format_messages(messages, system_prompt, system_prompt_content)

    @override
    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        *,
        tool_choice: ToolChoice | None = None,
        system_prompt_content: list[SystemContentBlock] | None = None,
        invocation_state: dict[str, Any] | None = None,
        agent_metadata: AgentMetadata | None = None,
        cancel_signal: threading.Event | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Send one non-streamed chat completion and replay it as Strands events (nothing once cancelled)."""
        request = self.format_request(
            messages,
            tool_specs,
            system_prompt,
            tool_choice,
            system_prompt_content=system_prompt_content,
            agent_metadata=agent_metadata,
        )
        request["stream"] = False
        request.pop("stream_options", None)
        started = time.perf_counter()
        async with self._get_client() as client:
            try:
                response = await unless_cancelled(client.chat.completions.create(**request), cancel_signal)
            except openai.APIError as error:
                if isinstance(error, openai.APIStatusError) and error.status_code == 429:
                    raise ModelThrottledException(str(error)) from error
                client_error = isinstance(error, openai.APIStatusError) and error.status_code < 500
                if client_error and is_context_overflow(error):  # a 5xx saying "too long" is the server's failure
                    raise ContextWindowOverflowException(str(error)) from error
                if not client_error:  # 5xx, timeout, connection: the server failed, not the policy (masked)
                    raise EngineUnavailableError(f"chat completion failed after the client's retries: {error}",
                                                 url=str(client.base_url), cause=type(error).__name__) from error
                raise
        if response is None:  # cancelled: the connection was closed, so the server aborts the request
            record_model_call(invocation_state, ModelCall(messages=request["messages"], tools=request.get("tools", []),
                                                          output=cancelled_output()))
            return
        latency_ms = int(1000 * (time.perf_counter() - started))
        output = parse_chat_completion(response)
        record_model_call(
            invocation_state, ModelCall(messages=request["messages"], tools=request.get("tools", []), output=output)
        )
        self._guard.protect(invocation_state, output.tool_calls)
        for event in output_events(output, latency_ms):
            yield event
