"""Rollouts of agents on their own model client, read back from the trace store into a ``FinishedRollout``.

A Strands agent on ``OpenAIModel`` or ``NonStreamingOpenAIModel`` over a traced client
(``rllm.tracing.get_chat_client_async`` against the LiteLLM proxy) runs in a fresh tracing session.
Its recorder says how it ended (the budget, typed tool failures, the one classifier); its calls come
back from the proxy's ``TraceStore`` (``rllm.tracing.trajectory_from_traces``) and become the
record's trajectories, one per token sequence (a sample), each with its exact ``TokenTrace``. So it
evaluates like any rollout, and its samples train where the backend returned token ids.

In training the same agent's client goes to the trainer's ``PolicyServer`` instead of the proxy
(``run_served_rollout``): the server answers every call with the rollout's token engine and keeps
the traces the proxy would have stored, so the record is read the same way, and checked against
the tokens the engine sampled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from strands import Agent
from strands.models.model import Model

from rllm.engine.rollout.token_engine import TokenEngine, TokenSession
from rllm.errors import ConfigurationError, GenerationAbortedError, StoreWriteError, TokenTraceError
from rllm.integrations.strands._cancel import CANCELLED
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.integrations.strands.rollout import (
    Built,
    FinishedRollout,
    finished_rollout,
    invoke_agent,
    read_rollout,
    refuse_other_models,
    rollout_recorder,
)
from rllm.integrations.strands.teams import run_built
from rllm.tracing.policy_server import CALL_HEADER, PolicyServer
from rllm.tracing.session import session
from rllm.tracing.trajectory import SessionTrajectory, trajectory_from_traces
from rllm.types import TerminationReason, Trajectory

logger = logging.getLogger(__name__)


class TraceSource(Protocol):
    """Where a session's traces are read: a ``TraceStore`` (the proxy's) or a ``PolicyServer``."""

    @property
    def path(self) -> Any: ...

    def get_session(self, session_id: str) -> list[dict[str, Any]]: ...


async def run_traced_rollout(
    agent: Agent, prompt: Any, store: TraceSource, *, recorder: RolloutRecorder | None = None,
    timeout_s: float | None = None, response_length: int | None = None, wait_s: float = 30.0,
    session_id: str | None = None,
) -> FinishedRollout:
    """``run_rollout`` for an agent whose model calls go through the tracing proxy that writes ``store``.

    The run gets a fresh session; afterwards its traces are read from ``store`` (waiting up to
    ``wait_s`` for calls the proxy logs after answering) and become the trajectories, one per token
    sequence. Calls without token ids leave the record without samples (``token_samples()`` raises).
    None of the agent's calls in the store is a ``ConfigurationError`` (its model is not on a
    traced client); some missing is a ``StoreWriteError`` (infrastructure). ``recorder``,
    ``timeout_s`` and ``response_length`` are ``run_rollout``'s; ``session_id`` names the session
    (fresh and random by default). A call the backend cut (a stored finish reason ``abort``) ends
    the rollout as ``GenerationAbortedError`` (infrastructure: unscored, no final answer), whatever
    the client made of it, unless the run ended on an error that is neither policy nor infrastructure.
    """
    recorder = rollout_recorder(agent, recorder, "run_traced_rollout")
    before = _model_calls(recorder)
    async with session(session_id=session_id) as ctx:
        end, error, latency = await invoke_agent(agent, prompt, recorder, timeout_s)
    calls = _model_calls(recorder) - before
    traces = await _traces(store, ctx.id, calls, wait_s)
    rebuilt = trajectory_from_traces(traces, name=recorder.steps.name)
    stored = len(rebuilt.trajectory.steps)
    if stored < calls:
        if stored == 0:
            error = ConfigurationError(
                f"none of the agent's {calls} model calls reached the trace store {store.path} (session {ctx.id}): "
                "build its model on rllm.tracing.get_chat_client_async(proxy.base_url, proxy.api_key) and pass "
                "the store of that proxy")
        else:
            error = StoreWriteError(f"only {stored} of the agent's {calls} model calls reached the trace store "
                                    f"{store.path} (session {ctx.id}) within {wait_s} s")
        end = read_rollout(recorder, error)
    cut = _cut_call(traces)
    if cut is not None and end.reason is not TerminationReason.ERROR:  # a bug or misconfiguration stays the cause
        error = GenerationAbortedError(
            f"the backend cut call {cut} of session {ctx.id} (finish reason 'abort'); the client took the cut text "
            "for an answer, so the rollout is neither scored nor trained", url=str(store.path), cause="abort")
        end = read_rollout(recorder, error)
    trajectories = _samples(rebuilt, recorder, ctx.id)
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


def _model_calls(recorder: RolloutRecorder) -> int:
    """The model calls the recorder saw answered (a cancelled call's placeholder is no call)."""
    return sum(1 for t in recorder.trajectories for step in t.steps if step.stop_reason != CANCELLED)


async def run_served_rollout(
    agent: Agent, prompt: Any, server: PolicyServer, engine: TokenEngine, *, recorder: RolloutRecorder | None = None,
    params: dict[str, Any] | None = None, timeout_s: float | None = None, response_length: int | None = None,
) -> FinishedRollout:
    """``run_traced_rollout`` for an agent whose own client calls ``server`` (training): its record.

    The rollout opens a session on ``server`` served by ``engine`` (``params``: sampling under every
    call's own); its record is read from the server's traces, as from the proxy's store. A run that
    raised because of a failed call (the HTTP error the client saw names it in ``x-rllm-call``) ends on
    what the engine raised for that very call; a failure the agent recovered from (an overflow Strands
    reduced, a 503 the client retried) never decides how a later one ends. The record's samples must
    be the engine's ``TokenSession`` samples, token for token (``TokenTraceError`` otherwise: the
    traces do not say what was sampled). The record's ``token_sessions`` is that session (a
    ``VerlSession`` carries verl's reports on its generations). The call's ``params`` are the
    trainer's sampling: the sampling keys the client sends are ignored (``PolicyServer``).
    """
    recorder = rollout_recorder(agent, recorder, "run_served_rollout")
    session_id = f"rollout-{uuid.uuid4().hex}"
    with server.open(session_id, engine, params) as served:
        finished = await run_traced_rollout(agent, prompt, server, recorder=recorder, timeout_s=timeout_s,
                                            response_length=response_length, wait_s=0.0, session_id=session_id)
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


class OwnClient(Protocol):
    """Where the calls of an agent on its own model client go, and where its record is read back.

    One idea in evaluation (``ThroughProxy``: the LiteLLM proxy and its ``TraceStore``) and training
    (``ServedPolicy``: the trainer's ``PolicyServer``); ``run_factory_built`` runs either the same way.
    """

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout: ...


@dataclass(frozen=True)
class ThroughProxy:
    """Evaluation: the agent's client calls the tracing proxy that writes ``store`` (``run_traced_rollout``)."""

    store: TraceSource
    wait_s: float = 30.0

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout:
        return await run_traced_rollout(agent, prompt, self.store, recorder=recorder, timeout_s=timeout_s,
                                        response_length=response_length, wait_s=self.wait_s)


@dataclass(frozen=True)
class ServedPolicy:
    """Training: the agent's client calls the trainer's ``server``, answered by ``engine`` (``run_served_rollout``)."""

    server: PolicyServer
    engine: TokenEngine
    params: dict[str, Any] | None = None

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout:
        return await run_served_rollout(agent, prompt, self.server, self.engine, recorder=recorder,
                                        params=self.params, timeout_s=timeout_s, response_length=response_length)


def check_factory_built(built: Built, model: Model, *, own_client: bool, who: str, fix: str) -> bool:
    """Whether what a factory built runs on its own client; ``ConfigurationError`` for what cannot be recorded.

    With ``own_client`` one ``Agent`` on another model runs on its own client; anything else must run on
    ``model`` (an agent or team node on another model is refused, ``who`` naming what built it and ``fix``
    what to do).
    """
    if own_client and isinstance(built, Agent) and built.model is not model:
        return True
    refuse_other_models(built, model, who, fix if not own_client else
                        "build every node on the model it is given (an own client serves one Agent, not a team's "
                        "nodes)")
    return False


async def run_factory_built(
    built: Built, prompt: Any, recorders: dict[str, RolloutRecorder], model: Model, *,
    own_client: OwnClient | None, who: str, fix: str, timeout_s: float | None = None,
    response_length: int | None = None,
) -> FinishedRollout:
    """Run what an agent factory built on ``model``, in evaluation or training: its record.

    With ``own_client`` one ``Agent`` on its own client runs there (``ThroughProxy`` in evaluation,
    ``ServedPolicy`` in training). Anything else runs on ``model`` (``run_built``); an agent or team node
    on another model is refused first, ``who`` naming what built it and ``fix`` what to do.
    """
    if check_factory_built(built, model, own_client=own_client is not None, who=who, fix=fix):
        (recorder,) = recorders.values()
        assert own_client is not None and isinstance(built, Agent)
        return await own_client.run(built, prompt, recorder, timeout_s=timeout_s, response_length=response_length)
    return await run_built(built, prompt, recorders, timeout_s=timeout_s, response_length=response_length)


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
