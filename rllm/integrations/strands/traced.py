"""Rollouts of agents on their own model client, read back from the trace store into a ``FinishedRollout``.

A Strands agent on ``OpenAIModel`` or ``NonStreamingOpenAIModel`` over a traced client
(``rllm.tracing.get_chat_client_async`` against the LiteLLM proxy) runs in a fresh tracing session.
Its recorder says how it ended (the budget, typed tool failures, the one classifier); its calls come
back from the proxy's ``TraceStore`` (``rllm.tracing.trajectory_from_traces``) and become the
record's trajectories, one per token sequence (a sample), each with its exact ``TokenTrace``. So it
evaluates like any rollout, and its samples train where the backend returned token ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from strands import Agent

from rllm.errors import ConfigurationError, StoreWriteError
from rllm.integrations.strands._cancel import CANCELLED
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.integrations.strands.rollout import (
    FinishedRollout,
    finished_rollout,
    invoke_agent,
    read_rollout,
    rollout_recorder,
)
from rllm.tracing.session import session
from rllm.tracing.store import TraceStore
from rllm.tracing.trajectory import SessionTrajectory, trajectory_from_traces
from rllm.types import Trajectory

logger = logging.getLogger(__name__)


async def run_traced_rollout(
    agent: Agent, prompt: Any, store: TraceStore, *, recorder: RolloutRecorder | None = None,
    timeout_s: float | None = None, response_length: int | None = None, wait_s: float = 30.0,
) -> FinishedRollout:
    """``run_rollout`` for an agent whose model calls go through the tracing proxy that writes ``store``.

    The run gets a fresh session; afterwards its traces are read from ``store`` (waiting up to
    ``wait_s`` for calls the proxy logs after answering) and become the trajectories, one per token
    sequence. Calls without token ids leave the record without samples (``token_samples()`` raises).
    None of the agent's calls in the store is a ``ConfigurationError`` (its model is not on a
    traced client); some missing is a ``StoreWriteError`` (infrastructure). ``recorder``,
    ``timeout_s`` and ``response_length`` are ``run_rollout``'s.
    """
    recorder = rollout_recorder(agent, recorder, "run_traced_rollout")
    before = _model_calls(recorder)
    async with session() as ctx:
        end, error, latency = await invoke_agent(agent, prompt, recorder, timeout_s)
    calls = _model_calls(recorder) - before
    rebuilt = trajectory_from_traces(await _traces(store, ctx.id, calls, wait_s), name=recorder.steps.name)
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
    trajectories = _samples(rebuilt, recorder, ctx.id)
    return finished_rollout(end, error, trajectories, latency, response_length)


def _model_calls(recorder: RolloutRecorder) -> int:
    """The model calls the recorder saw answered (a cancelled call's placeholder is no call)."""
    return sum(1 for t in recorder.trajectories for step in t.steps if step.stop_reason != CANCELLED)


async def _traces(store: TraceStore, session_id: str, calls: int, wait_s: float) -> list[dict[str, Any]]:
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
