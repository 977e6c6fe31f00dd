"""Teams: a Strands ``Swarm`` or ``Graph`` that an agent factory built, run and read as one episode.

``record_team`` puts a recorder on every node, all counting one ``Budget`` for the episode;
``run_team_rollout`` runs the team and reads it as ``run_rollout`` reads an agent (``read_team``: a
node's typed failure first, else the last node's end and answer), through the same
``finished_rollout``. A node whose run starts from a hand-off longer than the engine's prompt limit
ends the rollout ``context_overflow``, as a trimmed history does; only the task itself too long (an
entry node's first prompt) is a configuration error. ``record_built`` / ``run_built`` take what a
factory built, agent or team. This module builds on ``rollout.py``; ``rollout.py`` knows no team.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from strands import Agent
from strands.multiagent.base import MultiAgentBase

from rllm.errors import ContextLengthExceededError, PromptTooLongError, exception_chain
from rllm.integrations.strands.hooks import Budget, BudgetHook
from rllm.integrations.strands.recorder import RolloutRecorder, record
from rllm.integrations.strands.rollout import (
    Built,
    FinishedRollout,
    RolloutEnd,
    built_agents,
    finished_rollout,
    read_rollout,
    run_rollout,
)
from rllm.integrations.strands.termination import describe_failure, termination_reason_for
from rllm.types import TerminationReason

__all__ = ["read_team", "record_built", "record_team", "run_built", "run_team_rollout"]


def record_team(team: MultiAgentBase, *, budget: Budget | None = None,
                infra_exceptions: tuple[type[BaseException], ...] = ()) -> dict[str, RolloutRecorder]:
    """A recorder on every node of a Strands ``Swarm`` or ``Graph``, its trajectories named by the node id.

    A node that is a ``StrandsAgent`` keeps its own recorder; any other ``Agent`` gets one with
    ``infra_exceptions``, and all of them count one ``budget`` for the whole episode (one
    ``BudgetHook``): a 3-node Swarm under ``max_model_turns=4`` makes 4 model calls in all, not 4 per
    node, as ``data.max_response_length`` counts every node's response. Nested teams and other
    executors are refused.
    """
    nodes = getattr(team, "nodes", None)
    if not isinstance(nodes, dict) or not nodes:
        raise TypeError(f"{type(team).__name__} has no nodes to record: a Strands Swarm or Graph is expected")
    shared = BudgetHook(budget or Budget())
    recorders: dict[str, RolloutRecorder] = {}
    for node_id, node in nodes.items():
        agent = node.executor
        if not isinstance(agent, Agent):
            raise TypeError(f"node {node_id!r} runs a {type(agent).__name__}; only Strands Agent nodes are recorded")
        recorders[node_id] = record(agent, name=str(node_id), budget_hook=shared, infra_exceptions=infra_exceptions)
    return recorders


def _runs(result: Any) -> list[str]:
    """The nodes' runs, in order (Swarm's ``node_history``, Graph's ``execution_order``); a node may run twice."""
    history = getattr(result, "node_history", None) or getattr(result, "execution_order", None) or []
    return [node.node_id for node in history]


def _node_order(result: Any, recorders: dict[str, RolloutRecorder]) -> list[str]:
    """The nodes in the order they first ran, then any other node that recorded a step."""
    order = list(dict.fromkeys(_runs(result)))
    return order + [n for n in recorders if n not in order and any(t.steps for t in recorders[n].trajectories)]


def _entry_nodes(team: MultiAgentBase) -> set[str]:
    """The nodes whose first run starts from the task: a Graph's entry points, a Swarm's (else its first node)."""
    points = getattr(team, "entry_points", None)
    if points:
        return {str(node.node_id) for node in points}
    entry = getattr(team, "entry_point", None)
    if entry is not None:
        return {str(entry.name)}
    return {str(node_id) for node_id in list(getattr(team, "nodes", {}))[:1]}


def _failed_node(team: MultiAgentBase, result: Any, error: BaseException) -> str | None:
    """The node whose run raised ``error`` (a Graph raises it from ``invoke_async``; its state keeps the result)."""
    results = getattr(result, "results", None) or getattr(getattr(team, "state", None), "results", None) or {}
    return next((str(node_id) for node_id, r in results.items() if r.result is error), None)


def _hand_off_overflow(team: MultiAgentBase, recorders: dict[str, RolloutRecorder], node_id: str | None,
                      error: BaseException) -> BaseException:
    """``error``, or, for a prompt too long at the start of a node run that began from a hand-off, a context overflow.

    The engine refuses a session's first prompt longer than its limit with ``PromptTooLongError``, a
    configuration error, since a rollout's first prompt is the task (system prompt, tools, question).
    In a team only an entry node's first run starts from the task; any other run starts from what
    the nodes before it wrote (the hand-off), the policy's doing as a trimmed history is: that
    rollout's ``ContextLengthExceededError`` (``context_overflow``, counted against the guard's
    share), the run goes on.
    """
    too_long = next((cause for cause in exception_chain(error) if isinstance(cause, PromptTooLongError)), None)
    recorder = recorders.get(node_id) if node_id is not None else None
    if too_long is None or recorder is None:
        return error
    if node_id in _entry_nodes(team) and len(recorder.token_sessions) <= 1:
        return error  # the task itself is too long: data or configuration
    overflow = ContextLengthExceededError(
        f"team node {node_id!r} starts from a hand-off longer than the prompt limit, so the rollout's context "
        f"overflows ({too_long})")
    overflow.__cause__ = error
    return overflow


def _node_failure(result: Any, recorders: dict[str, RolloutRecorder],
                  team: MultiAgentBase | None) -> BaseException | None:
    """What the first failed node run raised (a Swarm keeps it in its result and raises nothing), else ``None``.

    With ``team``, a hand-off too long for the prompt limit is read as that rollout's overflow (``_hand_off_overflow``).
    """
    failed = [(str(n), r.result) for n, r in (getattr(result, "results", None) or {}).items()
              if isinstance(r.result, Exception)]
    if not failed:
        return None
    node_id, error = failed[0]
    return error if team is None else _hand_off_overflow(team, recorders, node_id, error)


def read_team(result: Any, recorders: dict[str, RolloutRecorder], error: BaseException | None, *,
              team: MultiAgentBase | None = None) -> RolloutEnd:
    """How a team's run ended: a node's typed failure first, else the end of the last node run (the team's answer).

    With ``team``, a node's first prompt too long after a hand-off is that rollout's overflow (``_hand_off_overflow``).
    """
    if error is not None:
        return RolloutEnd(reason=termination_reason_for(error), failure=describe_failure(error), final_answer="")
    order = _node_order(result, recorders)
    for node_id in order:  # infrastructure or a configuration error in any node ends the team's episode
        failures = recorders[node_id].tool_failures
        if failures.reason is not None or failures.fatal is not None:
            return read_rollout(recorders[node_id])
    first = _node_failure(result, recorders, team)
    if first is not None:
        return RolloutEnd(reason=termination_reason_for(first), failure=describe_failure(first), final_answer="")
    runs = _runs(result) or order
    if not runs:
        return RolloutEnd(reason=TerminationReason.ERROR, failure="no node of the team ran", final_answer="")
    last = runs[-1]
    node_result = (getattr(result, "results", None) or {}).get(last)
    stop_reason = getattr(getattr(node_result, "result", None), "stop_reason", None)
    return read_rollout(recorders[last], None, stop_reason)


async def run_team_rollout(
    team: MultiAgentBase, prompt: Any, *, recorders: dict[str, RolloutRecorder], timeout_s: float | None = None,
    response_length: int | None = None,
) -> FinishedRollout:
    """Run a Strands ``Swarm`` or ``Graph`` on ``prompt`` as one episode, read as ``run_rollout`` reads an agent.

    ``recorders`` come from ``record_team``. The trajectories are every node's (named by node id, one
    per sample), in the order the nodes first ran; the end is a node's typed failure if one had any,
    else the last node's, whose final answer is the team's; a tool's ``ConfigurationError`` is raised.
    ``error`` is what the team raised, else what its first failed node run raised (a Swarm raises
    nothing itself). A node run that starts from a hand-off longer than the engine's prompt limit
    ends the rollout ``context_overflow`` with what the nodes before it sampled (``_hand_off_overflow``).
    """
    error: BaseException | None = None
    result: Any = None
    started = time.perf_counter()
    try:
        run = team.invoke_async(prompt)
        result = await (run if timeout_s is None else asyncio.wait_for(run, timeout=timeout_s))
        fatal = next((r.tool_failures.fatal for r in recorders.values() if r.tool_failures.fatal is not None), None)
        if fatal is not None:
            raise fatal
    except Exception as caught:  # noqa: BLE001 - classified here; the consumer decides what to raise
        error = caught
    latency = time.perf_counter() - started
    if error is not None:
        error = _hand_off_overflow(team, recorders, _failed_node(team, result, error), error)
    end = read_team(result, recorders, error, team=team)
    if error is None:  # kept as an agent's run keeps what it raised (a consumer raises it with its cause)
        error = _node_failure(result, recorders, team)
    order = _node_order(result, recorders) if result is not None else list(recorders)
    trajectories = [t for node_id in order for t in recorders[node_id].trajectories if t.steps or t.token_trace]
    finished = finished_rollout(end, error, trajectories, latency, response_length, agents=built_agents(team),
                                token_sessions=[s for r in recorders.values() for s in r.token_sessions])
    finished.metrics["nodes"] = float(len({t.name for t in trajectories}))
    return finished


def record_built(built: Built, *, name: str | None = None, budget: Budget | None = None,
                 infra_exceptions: tuple[type[BaseException], ...] = ()) -> dict[str, RolloutRecorder]:
    """The recorders of what a factory built, by node id: one for an agent (under ``name``), one per node of a team."""
    if isinstance(built, MultiAgentBase):
        return record_team(built, budget=budget, infra_exceptions=infra_exceptions)
    if not isinstance(built, Agent):
        raise TypeError(f"an agent factory returned a {type(built).__name__}, not a Strands Agent, Swarm or Graph")
    recorder = record(built, budget=budget, infra_exceptions=infra_exceptions)
    return {name or str(built.name): recorder}


async def run_built(built: Built, prompt: Any, recorders: dict[str, RolloutRecorder], *,
                    timeout_s: float | None = None, response_length: int | None = None) -> FinishedRollout:
    """``run_rollout`` for an agent, ``run_team_rollout`` for a team, with the recorders of ``record_built``."""
    if isinstance(built, MultiAgentBase):
        return await run_team_rollout(built, prompt, recorders=recorders, timeout_s=timeout_s,
                                      response_length=response_length)
    (recorder,) = recorders.values()
    return await run_rollout(built, prompt, recorder=recorder, timeout_s=timeout_s, response_length=response_length)
