"""Rollouts for local training, from the same runner as verl's agent loop (``rllm.integrations.strands.runner``).

``run_rollouts`` runs many prompts at once on any token engine (a batching engine samples them
together) and keeps what local training needs of each ``FinishedRollout``; unlike verl's loop it
raises on an infrastructure failure or a cancelled rollout, since a local run has no other rollouts to
fall back on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rllm.engine.rollout.token_engine import TokenEngine
from rllm.errors import ConfigurationError, RolloutCancelledError, ToolBackendError
from rllm.integrations.strands import Budget, RLLMModel
from rllm.integrations.strands.runner import (
    AgentChoice,
    AgentFactory,
    ClientRule,
    ServedPolicy,
    build_rollout,
    check_agent_choice,
)
from rllm.tracing.policy_server import PolicyServer
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
        metrics: ``FinishedRollout.metrics``: turns, tool_calls, tool_errors, prompt/completion tokens, latency_s.
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
    """What to run: the prompt, its group, the sampling of every model call, and the task an agent factory gets."""

    prompt: str
    group: str
    sampling: dict[str, Any]
    task: dict[str, Any] | None = None


async def _run_one(engine: TokenEngine, request: RolloutRequest, choice: AgentChoice, *, response_length: int,
                   policy_server: PolicyServer | None = None) -> Rollout:
    """Run the agent ``choice`` builds on ``request.prompt``: its exact tokens and outcome.

    Raises what the agent's run raised unless it is a policy outcome (budget, context, response
    length), as ``StrandsAgentLoop`` does. An infrastructure failure raises too (a generation the
    server aborted: ``GenerationAbortedError``), a ``ToolBackendError`` naming it when no exception
    carried it (a tool backend marking its own failure), and a cancelled rollout raises
    ``RolloutCancelledError``: a local run has no other rollouts to fall back on, and scoring
    either would train on it. With ``policy_server`` the factory's agent calls it on its own client.
    """
    model = RLLMModel(engine, params=dict(request.sampling))
    rollout = build_rollout(choice, model, dict(request.task or {"prompt": request.prompt}))
    own_client = None if policy_server is None else ServedPolicy(policy_server, engine, dict(request.sampling))
    finished = await rollout.run(request.prompt, own_client=own_client, response_length=response_length)
    finished.raise_if_unexpected()
    end = finished.end
    if end.infra_failure:
        if finished.error is not None:
            raise finished.error
        # Only a tool backend ends a rollout on infrastructure without an exception escaping the run.
        raise ToolBackendError(f"the rollout ended on an infrastructure failure: {end.failure}")
    if not end.scored:
        raise RolloutCancelledError(f"the rollout ended {end.reason.value}: nothing to score or train on")
    samples = finished.token_samples()
    if len(samples) != 1:  # a factory's conversation manager, or a team: verl's trainer takes several
        raise ConfigurationError(f"the rollout came back as {len(samples)} samples (a rewritten history, or a team's "
                                 "nodes); the local trainer trains one sample per rollout: train it with verl's "
                                 "trainer")
    return Rollout(
        group=request.group,
        fields=samples[0],
        reason=end.reason,
        final_answer=end.final_answer,
        metrics=finished.metrics,
        truncated=finished.truncated,
    )


async def run_rollouts(
    engine: TokenEngine, requests: Sequence[RolloutRequest], *, tools: list[Any] | None = None,
    system_prompt: str | None = None, budget: Budget, response_length: int, agent_factory: AgentFactory | None = None,
    own_client: bool = False,
) -> list[Rollout]:
    """Run every request concurrently (in order of ``requests``).

    The agent is a ``StrandsAgent`` with ``tools`` and ``system_prompt``, or whatever
    ``agent_factory(model, request.task)`` builds on the rollout's model, as in evaluation and in the
    verl loop; ``budget`` applies to either. ``own_client``: the factory's agent may keep its own
    OpenAI client, served here as in the verl loop (a ``PolicyServer`` over ``engine`` for the
    duration of the call, its address exported to ``RLLM_POLICY_*`` before the factory runs).
    """
    check_agent_choice("run_rollouts", agent_factory=agent_factory, tools=tools, system_prompt=system_prompt,
                       own_client=own_client)
    choice = AgentChoice(
        agent_factory=agent_factory, tools=tools, system_prompt=system_prompt, budget=budget,
        name="local_rollout" if agent_factory is None else None,
        client=ClientRule.MAY_OWN if own_client else ClientRule.MODEL, who="run_rollouts: agent_factory",
        fix="build it on the model it is given, or, for an agent on its own OpenAI client, pass own_client=True")
    server = (await PolicyServer().start()) if own_client else None
    if server is not None:
        server.export()
    try:
        return list(await asyncio.gather(*(
            _run_one(engine, r, choice, response_length=response_length, policy_server=server)
            for r in requests
        )))
    finally:
        if server is not None:
            await server.stop()
