"""How a model hands the exact record of one call to the agent that made it.

Strands passes each agent invocation its own ``invocation_state`` dict down to ``Model.stream``.
A model writes a ``ModelCall`` there and the agent's ``AfterModelCallEvent`` hook takes it. The
model keeps no reference to any agent, so one model object can serve many agents at once and
every call is still recorded on the agent that made it.

A token engine's rollout state (its ``TokenSession``) goes the same way the other direction: the
agent leaves a receiver in ``invocation_state`` before each model call and the model hands the
session to it as soon as the call has one, before the engine runs, so the agent holds it (and its
trace) from the first call on, also when that call fails or is cancelled.

A model call made outside the agent loop but inside an agent's run (a *side call*: Strands'
``SummarizingConversationManager`` and its context managers, ``context_manager="auto"`` and the
rest, ask the agent's model for a summary with a bare ``model.stream``, no model state) belongs to
that run all the same. The recorder opens a ``RunState`` in a context variable for each invocation
of its agent (``start_run`` / ``end_run``, so nothing outlives the run: a reward judge calling the
same model afterwards samples in no rollout's session); it holds the model state of the run's
latest call, which a side call falls back to (``rollout_model_state``), so the summary is sampled in
the rollout's token session, as a sample of its own, and hands the side call to the recorder
(``record_side_call``), which records it as a step of that sample.

Every node of a Strands ``Swarm`` or ``Graph`` gets the same ``invocation_state`` dict, and a Graph runs
nodes concurrently. The hand-overs stay apart because each is written and read without the event
loop running anything in between: the receiver is set by the agent's ``BeforeModelCallEvent`` hook
and read by the model before its first await; the ``ModelCall`` is written after the engine's answer
and taken by the ``AfterModelCallEvent`` hook before Strands next awaits
(``tests/rllm/integrations/strands/test_teams.py`` finishes two nodes' generations together).

Tool calls the model could not parse travel the same way: the model leaves them in
``invocation_state`` for the ``MalformedCallGuard`` it registered on the agent, which refuses them
and reports the refusal to the agent's receiver, if the agent left one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from rllm.integrations.strands._turns import TurnMark
from rllm.types import ModelOutput, ToolCall

MODEL_CALL_KEY = "rllm.model_call"
TOKEN_SESSION_KEY = "rllm.token_session"
TOKEN_SESSION_RECEIVER_KEY = "rllm.token_session_receiver"
MALFORMED_CALLS_KEY = "rllm.malformed_calls"
TOOL_ERROR_RECEIVER_KEY = "rllm.tool_error_receiver"


@dataclass
class ModelCall:
    """The request one model call sent (OpenAI format), what came back and, with a token engine, its turn."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    output: ModelOutput
    turn: TurnMark | None = None


@dataclass
class RunState:
    """One invocation of a recorded agent: its latest call's model state and where its side calls go.

    Attributes:
        agent: The agent whose run it is (calls of other agents never move ``model_state``).
        receive_session: The recorder's receiver of the run's token session.
        receive_side_call: The recorder's receiver of a side call's ``ModelCall``.
        model_state: The model state of the run's latest call (a side call runs in it).
    """

    agent: Any
    receive_session: Callable[[Any], None]
    receive_side_call: Callable[[ModelCall], None]
    model_state: dict[str, Any] | None = None


_RUN: ContextVar[RunState | None] = ContextVar("rllm.run_state", default=None)


def start_run(run: RunState) -> Token[RunState | None]:
    """Open ``run`` for the current invocation; ``end_run`` with the token closes it."""
    return _RUN.set(run)


def end_run(token: Token[RunState | None]) -> None:
    """Close the run ``token`` opened, restoring the run around it (an outer agent's, or none)."""
    try:
        _RUN.reset(token)
    except ValueError:  # closed from another context (a generator finalized elsewhere): close it there
        _RUN.set(token.old_value if token.old_value is not Token.MISSING else None)


def current_run() -> RunState | None:
    """The recorded run the current code runs in, if any."""
    return _RUN.get()


def rollout_model_state(model_state: dict[str, Any] | None,
                        invocation_state: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The model state a call runs in: its own (remembered by its agent's run), or for a side call the run's.

    A side call before the run's first model call gets a fresh model state that the run keeps.
    """
    run = _RUN.get()
    if model_state is not None:
        if run is not None and (invocation_state or {}).get("agent") is run.agent:
            run.model_state = model_state
        return model_state
    if run is None:
        return None
    if run.model_state is None:
        run.model_state = {}
    return run.model_state


def record_side_call(call: ModelCall) -> bool:
    """Hand a side call to the run's recorder, which records it as a step; whether a run took it."""
    run = _RUN.get()
    if run is None:
        return False
    run.receive_side_call(call)
    return True


def record_model_call(invocation_state: dict[str, Any] | None, call: ModelCall) -> None:
    """Leave ``call`` for the invoking agent; a bare ``model.stream`` with no agent records nothing."""
    if invocation_state is not None:
        invocation_state[MODEL_CALL_KEY] = call


def receive_token_session(invocation_state: dict[str, Any], receiver: Callable[[Any], None]) -> None:
    """Ask for the token session of the coming model call: the model passes it to ``receiver``."""
    invocation_state[TOKEN_SESSION_RECEIVER_KEY] = receiver


def record_token_session(invocation_state: dict[str, Any] | None, session: Any) -> None:
    """Hand the rollout's token session to the invoking agent, if it asked for it (before the engine runs).

    A side call (no ``invocation_state``) hands it to the run it happens in, if any.
    """
    if invocation_state is None:
        run = _RUN.get()
        if run is not None:
            run.receive_session(session)
        return
    receiver = invocation_state.get(TOKEN_SESSION_RECEIVER_KEY)
    if receiver is not None:
        receiver(session)


def take_model_call(invocation_state: dict[str, Any]) -> ModelCall | None:
    """Remove and return the call the model recorded, if it recorded one."""
    return invocation_state.pop(MODEL_CALL_KEY, None)


def record_malformed_calls(invocation_state: dict[str, Any], calls: Iterable[ToolCall]) -> None:
    """Leave the calls the model could not parse (``call.error`` set) for the guard that refuses them."""
    pending = invocation_state.setdefault(MALFORMED_CALLS_KEY, {})
    pending.update({call.id: call for call in calls if call.error is not None})


def take_malformed_call(invocation_state: dict[str, Any], tool_use_id: str) -> ToolCall | None:
    """Remove and return the unparseable call with this tool-use id, if the model left one."""
    return (invocation_state.get(MALFORMED_CALLS_KEY) or {}).pop(tool_use_id, None)


def receive_tool_errors(invocation_state: dict[str, Any], receiver: Callable[[str, str, str], None]) -> None:
    """Ask to be told of refused tool calls: ``receiver(tool_use_id, name, error)``."""
    invocation_state[TOOL_ERROR_RECEIVER_KEY] = receiver


def report_tool_error(invocation_state: dict[str, Any], tool_use_id: str, name: str, error: str) -> None:
    """Tell the invoking agent, if it asked, that a tool call was refused with ``error``."""
    receiver = invocation_state.get(TOOL_ERROR_RECEIVER_KEY)
    if receiver is not None:
        receiver(tool_use_id, name, error)
