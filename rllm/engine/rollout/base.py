"""The rollout-engine interface and the errors every engine raises.

An engine turns OpenAI-format chat messages (and tool schemas) into one ``ModelOutput``. The
error classes (in ``rllm.errors``, imported from there) let callers tell an infrastructure
failure (mask it, retry the rollout) from a request the model itself made impossible (context
overflow: the episode ends, it is not retried).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rllm.types import ModelOutput

__all__ = ["SAMPLING_PARAMS", "RolloutEngine", "mentions_context_overflow", "select_sampling_params"]

# Sampling parameters an engine forwards to the server. Anything else given as a keyword (Strands
# passes its own: system_prompt_content, invocation_state, agent_metadata, ...) is dropped.
SAMPLING_PARAMS: frozenset[str] = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "chat_template_kwargs",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "min_tokens",
    }
)


CONTEXT_OVERFLOW_PHRASES = (
    "context length",
    "maximum context",
    "context_length_exceeded",
    "max_model_len",
    "too long",
    "too many tokens",
    "exceed",
)
"""What an OpenAI-compatible server, SGLang or vLLM writes when a prompt does not fit the context window."""


def mentions_context_overflow(message: str) -> bool:
    """Whether an engine's error message says the prompt does not fit the context window."""
    message = message.lower()
    return any(phrase in message for phrase in CONTEXT_OVERFLOW_PHRASES)


def select_sampling_params(params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split keywords into the allowed sampling parameters and the names that were dropped."""
    kept = {k: v for k, v in params.items() if k in SAMPLING_PARAMS and v is not None}
    dropped = sorted(k for k in params if k not in SAMPLING_PARAMS)
    return kept, dropped


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that answers chat messages with a ``ModelOutput``."""

    async def get_model_response(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ModelOutput:
        """Generate one assistant turn for ``messages``."""
        ...
