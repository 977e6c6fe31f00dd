"""Rollouts for local training, run by the same runner and exported by the same code as verl's agent loop.

``StrandsAgentLoop`` builds each trajectory's agent with ``build_agent``, reads its end with
``read_rollout`` and exports ``agent.trajectory.token_trace`` with ``TokenTrace.to_verl`` cut at
the response length. ``run_rollout`` does exactly that for one prompt on any token engine, and
``run_rollouts`` runs many at once (a batching engine samples them together).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rllm.engine.rollout.token_engine import TokenEngine
from rllm.errors import InfrastructureError
from rllm.integrations.strands import Budget, RLLMModel
from rllm.integrations.strands.rollout import build_agent, read_rollout, run_token_rollout, trajectory_metrics
from rllm.types import TerminationReason


@dataclass
class Rollout:
    """One finished rollout: its verl fields, how it ended and what it did.

    Attributes:
        group: Rollouts of one prompt share a group (verl's ``uid``); RLOO's baseline is per group.
        fields: ``TokenTrace.to_verl(response_length)``: prompt_ids, response_ids, response_mask,
            response_logprobs, num_turns.
        reason: Why it ended.
        final_answer: The answer of a rollout that finished, else "".
        metrics: ``trajectory_metrics``: turns, tool_calls, tool_errors, prompt/completion tokens.
        truncated: The response ran past ``response_length`` and was cut.
        reward: Filled in by the caller's scorer.
    """

    group: str
    fields: dict[str, Any]
    reason: TerminationReason
    final_answer: str
    metrics: dict[str, float]
    truncated: bool
    reward: float = 0.0


@dataclass(frozen=True)
class RolloutRequest:
    """What to run: the user's prompt, its group, and the sampling of every model call."""

    prompt: str
    group: str
    sampling: dict[str, Any]


async def run_rollout(
    engine: TokenEngine, request: RolloutRequest, *, tools: list[Any], system_prompt: str | None, budget: Budget,
    response_length: int,
) -> Rollout:
    """Run the agent on ``request.prompt`` and return its exact tokens and outcome.

    Raises what the agent's run raised unless it is a policy outcome (budget, context, response
    length), as ``StrandsAgentLoop`` does (``run_token_rollout``). An infrastructure failure
    raises too, an ``InfrastructureError`` naming it when no exception carried it (a tool backend
    marking its own failure): a local run has no other rollouts to fall back on, and scoring it
    would train on it.
    """
    agent = build_agent(RLLMModel(engine, params=dict(request.sampling)), tools=tools, system_prompt=system_prompt,
                        budget=budget, name="local_rollout")
    error = await run_token_rollout(agent, request.prompt)
    end = read_rollout(agent, error)
    if end.infra_failure:
        if error is not None:
            raise error
        raise InfrastructureError(f"the rollout ended on an infrastructure failure: {end.failure}")
    trace = agent.trajectory.token_trace
    assert trace is not None  # run_token_rollout raised otherwise
    return Rollout(
        group=request.group,
        fields=trace.to_verl(response_length),
        reason=end.reason,
        final_answer=end.final_answer,
        metrics=trajectory_metrics(agent.trajectory),
        truncated=len(trace) - trace.prompt_length > response_length,
    )


async def run_rollouts(
    engine: TokenEngine, requests: Sequence[RolloutRequest], *, tools: list[Any], system_prompt: str | None,
    budget: Budget, response_length: int,
) -> list[Rollout]:
    """Run every request concurrently (in order of ``requests``)."""
    return list(await asyncio.gather(*(
        run_rollout(engine, r, tools=tools, system_prompt=system_prompt, budget=budget, response_length=response_length)
        for r in requests
    )))
