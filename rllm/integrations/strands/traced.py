"""The reader of traces: the calls of an agent on its own model client, read back into a ``FinishedRollout``.

A Strands agent on ``OpenAIModel`` or ``NonStreamingOpenAIModel`` over a traced client (the LiteLLM
proxy's, or in training the trainer's ``PolicyServer``) runs in a session of its own
(``rllm.integrations.strands.runner``: ``run_traced_rollout``, ``run_served_rollout``). Its recorder
says how it ended (the budget, typed tool failures, the one classifier); its calls come back from the
trace store (``rllm.tracing.trajectory_from_traces``) and become the record's trajectories, one per
token sequence (a sample), each with its exact ``TokenTrace`` (``read_traced_rollout``). So it
evaluates like any rollout, and its samples train where the backend returned token ids. A policy
server's record is also checked against the tokens its engine sampled (``read_served_rollout``).
This module runs nothing: it only reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Protocol

from strands import Agent

from rllm.engine.rollout.token_engine import TokenSession
from rllm.errors import ConfigurationError, GenerationAbortedError, StoreWriteError, TokenTraceError
from rllm.integrations.strands._cancel import CANCELLED
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.integrations.strands.rollout import FinishedRollout, RolloutEnd, finished_rollout, read_rollout
from rllm.tracing.policy_server import CALL_HEADER, ServedSession
from rllm.tracing.trajectory import SessionTrajectory, trajectory_from_traces
from rllm.types import TerminationReason, Trajectory

logger = logging.getLogger(__name__)


class TraceSource(Protocol):
    """Where a session's traces are read: a ``TraceStore`` (the proxy's) or a ``PolicyServer``."""

    @property
    def path(self) -> Any: ...

    def get_session(self, session_id: str) -> list[dict[str, Any]]: ...


def answered_calls(recorder: RolloutRecorder) -> int:
    """The model calls the recorder saw answered (a cancelled call's placeholder is no call)."""
    return sum(1 for t in recorder.trajectories for step in t.steps if step.stop_reason != CANCELLED)


async def read_traced_rollout(
    agent: Agent, recorder: RolloutRecorder, ran: tuple[RolloutEnd, BaseException | None, float], store: TraceSource,
    session_id: str, calls: int, *, wait_s: float, response_length: int | None,
) -> FinishedRollout:
    """The record of an agent's run in session ``session_id``, read from ``store``'s traces.

    ``ran`` is what ``invoke_agent`` returned for the run, ``calls`` the model calls it answered
    (``answered_calls`` after less before). The traces are read once ``calls`` of them are answered
    or ``wait_s`` has passed (the proxy logs a call after answering it) and become the trajectories,
    one per token sequence. Calls without token ids leave the record without samples
    (``token_samples()`` raises). None of the agent's calls in the store is a ``ConfigurationError``
    (its model is not on a traced client); some missing is a ``StoreWriteError`` (infrastructure). A
    call the backend cut (a stored finish reason ``abort``) ends the rollout as
    ``GenerationAbortedError`` (infrastructure: unscored, no final answer), whatever the client made
    of it, unless the run ended on an error that is neither policy nor infrastructure.
    """
    end, error, latency = ran
    traces = await _traces(store, session_id, calls, wait_s)
    rebuilt = trajectory_from_traces(traces, name=recorder.steps.name)
    stored = len(rebuilt.trajectory.steps)
    if stored < calls:
        if stored == 0:
            error = ConfigurationError(
                f"none of the agent's {calls} model calls reached the trace store {store.path} (session {session_id}): "
                "build its model on rllm.tracing.get_chat_client_async(proxy.base_url, proxy.api_key) and pass "
                "the store of that proxy")
        else:
            error = StoreWriteError(f"only {stored} of the agent's {calls} model calls reached the trace store "
                                    f"{store.path} (session {session_id}) within {wait_s} s")
        end = read_rollout(recorder, error)
    cut = _cut_call(traces)
    if cut is not None and end.reason is not TerminationReason.ERROR:  # a bug or misconfiguration stays the cause
        error = GenerationAbortedError(
            f"the backend cut call {cut} of session {session_id} (finish reason 'abort'); the client took the cut "
            "text for an answer, so the rollout is neither scored nor trained", url=str(store.path), cause="abort")
        end = read_rollout(recorder, error)
    trajectories = _samples(rebuilt, recorder, session_id)
    return finished_rollout(end, error, trajectories, latency, response_length, agents=[agent])


def _cut_call(traces: list[dict[str, Any]]) -> int | None:
    """The ``seq`` of the first answered call the backend cut (finish reason ``abort``), or ``None``.

    Strands' streaming ``OpenAIModel`` maps ``abort`` to ``end_turn``: only the stored trace says it.
    """
    for trace in traces:
        response = trace.get("response") or {}
        if response.get("finish_reason") == "abort":
            return int(trace.get("seq", -1))
    return None


def read_served_rollout(finished: FinishedRollout, served: ServedSession, recorder: RolloutRecorder,
                        session_id: str) -> FinishedRollout:
    """The record of an agent whose own client called a ``PolicyServer``, checked against what its engine sampled.

    ``finished`` is the record read from the server's traces (``read_traced_rollout``), ``served`` the
    server's session. A run that raised because of a failed call (the HTTP error the client saw names it
    in ``x-rllm-call``) ends on what the engine raised for that very call; a failure the agent recovered
    from (an overflow Strands reduced, a 503 the client retried) never decides how a later one ends. The
    record's samples must be the engine's ``TokenSession`` samples, token for token (``TokenTraceError``
    otherwise: the traces do not say what was sampled). The record's ``token_sessions`` is that session
    (a ``VerlSession`` carries verl's reports on its generations).
    """
    if served.error is not None and finished.error is not served.error \
            and _raised_by(finished.error, served.error_call):
        finished = dataclasses.replace(finished, end=read_rollout(recorder, served.error), error=served.error)
    _check_samples(finished, served.token_session, session_id)
    session = served.token_session
    finished.metrics["rewritten_calls"] = float(session.rewritten_calls)
    return dataclasses.replace(finished, token_sessions=[session],
                               generation_seconds=float(getattr(session, "generate_seconds", 0.0)),
                               num_preempted=int(getattr(session, "num_preempted", -1)))


def _raised_by(error: BaseException | None, call: str | None) -> bool:
    """Whether ``error`` is, or was raised from, the HTTP answer to the failed ``call`` of the policy server."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        response = getattr(error, "response", None)
        if call is not None and getattr(response, "headers", {}).get(CALL_HEADER) == call:
            return True
        error = error.__cause__ or error.__context__
    return False


def _check_samples(finished: FinishedRollout, token_session: TokenSession, session_id: str) -> None:
    """The record's token sequences are the ones the engine sampled (prompt, sampled ids, mask, logprobs)."""
    recorded = [t.token_trace for t in finished.trajectories if t.token_trace is not None and t.token_trace.num_turns]
    sampled = [t for t in token_session.samples if t.num_turns]
    if [_fields(t) for t in recorded] != [_fields(t) for t in sampled]:
        raise TokenTraceError(
            f"session {session_id}: the {len(recorded)} token sequence(s) read from the policy server's traces are "
            f"not the {len(sampled)} sample(s) its engine recorded; training on them would train on tokens that "
            "were not sampled as recorded")


def _fields(trace: Any) -> tuple[Any, ...]:
    return tuple(trace.token_ids), tuple(trace.loss_mask), tuple(trace.logprobs or ())


async def _traces(store: TraceSource, session_id: str, calls: int, wait_s: float) -> list[dict[str, Any]]:
    """The session's traces, once ``calls`` of them are answered or ``wait_s`` has passed (read off the loop)."""
    deadline = time.monotonic() + wait_s
    while True:
        traces = await asyncio.to_thread(store.get_session, session_id)
        answered = sum(1 for trace in traces if trace.get("response") is not None and trace.get("error") is None)
        if answered >= calls or time.monotonic() >= deadline:
            return traces
        await asyncio.sleep(0.05)


def _samples(rebuilt: SessionTrajectory, recorder: RolloutRecorder, session_id: str) -> list[Trajectory]:
    """One trajectory per token sequence, with the steps ``info["token_sequence"]`` assigns to it.

    A call without token ids leaves the rollout one trajectory without a trace (nothing to train on:
    a sample missing a call would train a part of the rollout as the whole). What the recorder noted
    on a step (refused tool calls; the tool results of a last round, which no later call shows) is
    put back on the stored step that made the same tool calls.
    """
    whole = rebuilt.trajectory
    noted = {call.id: step for t in recorder.trajectories for step in t.steps for call in step.tool_calls}
    for step in whole.steps:
        recorded = next((noted[call.id] for call in step.tool_calls if call.id in noted), None)
        if recorded is not None:
            step.tool_errors = list(recorded.tool_errors)
            step.observation = step.observation or list(recorded.observation)
    info = {"session_id": session_id, "capture": rebuilt.report()}
    if rebuilt.calls_without_token_ids or not rebuilt.token_traces:
        if rebuilt.calls_without_token_ids:
            logger.warning("session %s: %d of %d calls came without token ids; the rollout has no samples",
                           session_id, rebuilt.calls_without_token_ids, len(whole.steps))
        return [Trajectory(name=whole.name, steps=whole.steps, info=info)]
    samples = [Trajectory(name=whole.name, token_trace=trace, info={**info, "sample": index})
               for index, trace in enumerate(rebuilt.token_traces)]
    for step in whole.steps:
        samples[step.info["token_sequence"]].steps.append(step)
    return samples
