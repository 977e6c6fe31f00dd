"""How a model hands the exact record of one call to the agent that made it.

Strands passes each agent invocation its own ``invocation_state`` dict down to ``Model.stream``.
A model writes a ``ModelCall`` there and the agent's ``AfterModelCallEvent`` hook takes it. The
model keeps no reference to any agent, so one model object can serve many agents at once and
every call is still recorded on the agent that made it.

A token engine's rollout state (its ``TokenSession``) goes the same way the other direction: the
agent leaves a receiver in ``invocation_state`` before each model call and the model hands the
session to it as soon as the call has one, before the engine runs, so the agent holds it (and its
trace) from the first call on, also when that call fails or is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rllm.types import ModelOutput

MODEL_CALL_KEY = "rllm.model_call"
TOKEN_SESSION_KEY = "rllm.token_session"
TOKEN_SESSION_RECEIVER_KEY = "rllm.token_session_receiver"


@dataclass
class ModelCall:
    """The request one model call sent (OpenAI format) and what came back."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    output: ModelOutput


def record_model_call(invocation_state: dict[str, Any] | None, call: ModelCall) -> None:
    """Leave ``call`` for the invoking agent; a bare ``model.stream`` with no agent records nothing."""
    if invocation_state is not None:
        invocation_state[MODEL_CALL_KEY] = call


def receive_token_session(invocation_state: dict[str, Any], receiver: Callable[[Any], None]) -> None:
    """Ask for the token session of the coming model call: the model passes it to ``receiver``."""
    invocation_state[TOKEN_SESSION_RECEIVER_KEY] = receiver


def record_token_session(invocation_state: dict[str, Any] | None, session: Any) -> None:
    """Hand the rollout's token session to the invoking agent, if it asked for it (before the engine runs)."""
    receiver = (invocation_state or {}).get(TOKEN_SESSION_RECEIVER_KEY)
    if receiver is not None:
        receiver(session)


def take_model_call(invocation_state: dict[str, Any]) -> ModelCall | None:
    """Remove and return the call the model recorded, if it recorded one."""
    return invocation_state.pop(MODEL_CALL_KEY, None)
