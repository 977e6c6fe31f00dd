"""Why a Strands run ended: the one classifier that evaluation, the batch runner and training all use.

A wrong reason is a wrong training signal (a response budget used up scored as a context overflow,
a bug masked as infrastructure), so every consumer calls ``termination_reason_for`` and nothing
else maps an exception or a stop reason to a ``TerminationReason``.
"""

from __future__ import annotations

import asyncio

import openai
from strands.types.exceptions import (
    ContextWindowOverflowException,
    EventLoopException,
    MaxTokensReachedException,
    ModelThrottledException,
)

from rllm.errors import (
    ContextLengthExceededError,
    InfrastructureError,
    ResponseBudgetExhaustedError,
    ToolBackendError,
    exception_chain,
)
from rllm.types import TerminationReason

_STOP_REASONS = {
    "end_turn": TerminationReason.FINISHED,
    "tool_use": TerminationReason.FINISHED,
    "stop_sequence": TerminationReason.FINISHED,
    "max_tokens": TerminationReason.MAX_TOKENS,
    "cancelled": TerminationReason.CANCELLED,
}


def termination_reason_for(error: BaseException | None = None, *, stop_reason: str | None = None) -> TerminationReason:
    """Classify how a run ended: by what it raised (``error``) or, on a clean end, by its last ``stop_reason``.

    For an exception, by type only, never by its text:

    * a response budget used up (``ResponseBudgetExhaustedError`` anywhere behind ``error``, even
      wrapped in Strands' ``ContextWindowOverflowException``) is ``MAX_TOKENS``: the policy's own doing;
    * a context overflow is ``CONTEXT_OVERFLOW`` and a truncated answer ``MAX_TOKENS``;
    * a timeout is ``TIMEOUT``; a tool backend failure (``ToolBackendError``) is ``TOOL_BACKEND_ERROR``;
      any other ``InfrastructureError`` (the engine unreachable, throttled, aborting) is
      ``ENGINE_ERROR``, as are the OpenAI client's own connection failures and 5xx answers, which
      Strands' streaming ``OpenAIModel`` raises unchanged (an agent on its own traced client): these
      are infrastructure, masked in training;
    * anything else (a ``TypeError``, a template error, a ``ConfigurationError``) is ``ERROR``: a
      bug or a misconfiguration, never masked.

    Without an exception, Strands' stop reason of the last model call decides (``end_turn`` /
    ``tool_use`` / ``stop_sequence`` finished, ``max_tokens``, ``cancelled``); an unknown or
    missing one is ``ERROR``.
    """
    if error is None:
        return _STOP_REASONS.get(stop_reason or "", TerminationReason.ERROR)
    if any(isinstance(cause, ResponseBudgetExhaustedError) for cause in exception_chain(error)):
        return TerminationReason.MAX_TOKENS
    for cause in exception_chain(error, implicit=False):  # through Strands' EventLoopException wrapper
        if isinstance(cause, MaxTokensReachedException):
            return TerminationReason.MAX_TOKENS
        if isinstance(cause, (asyncio.TimeoutError, TimeoutError, openai.APITimeoutError)):
            return TerminationReason.TIMEOUT
        if isinstance(cause, (ContextWindowOverflowException, ContextLengthExceededError)):
            return TerminationReason.CONTEXT_OVERFLOW
        if isinstance(cause, ToolBackendError):
            return TerminationReason.TOOL_BACKEND_ERROR
        if isinstance(cause, (InfrastructureError, ModelThrottledException, openai.APIConnectionError,
                              openai.InternalServerError)):
            return TerminationReason.ENGINE_ERROR
    return TerminationReason.ERROR


def describe_failure(error: BaseException) -> str:
    """``"ExceptionType: message"`` of what ended a run, looking through Strands' ``EventLoopException`` wrapper."""
    while isinstance(error, EventLoopException) and error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {error}"
