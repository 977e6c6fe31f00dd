"""How a model hands the exact record of one call to the agent that made it.

Strands passes each agent invocation its own ``invocation_state`` dict down to ``Model.stream``.
A model writes a ``ModelCall`` there and the agent's ``AfterModelCallEvent`` hook takes it. The
model keeps no reference to any agent, so one model object can serve many agents at once and
every call is still recorded on the agent that made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rllm.tokens.trace import TokenTrace
from rllm.types import ModelOutput

MODEL_CALL_KEY = "rllm.model_call"
TOKEN_SESSION_KEY = "rllm.token_session"


@dataclass
class ModelCall:
    """The request one model call sent (OpenAI format) and what came back."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    output: ModelOutput
    token_trace: TokenTrace | None = None


def record_model_call(invocation_state: dict[str, Any] | None, call: ModelCall) -> None:
    """Leave ``call`` for the invoking agent; a bare ``model.stream`` with no agent records nothing."""
    if invocation_state is not None:
        invocation_state[MODEL_CALL_KEY] = call


def take_model_call(invocation_state: dict[str, Any]) -> ModelCall | None:
    """Remove and return the call the model recorded, if it recorded one."""
    return invocation_state.pop(MODEL_CALL_KEY, None)
