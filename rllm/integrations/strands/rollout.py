"""One runner for evaluation and training: a rollout's agent is built, run, and turned into what training reads.

``StrandsWorkflow`` (evaluation, batch rollouts), the verl ``StrandsAgentLoop`` and the local
trainer all build the agent with ``build_agent`` and run it with ``run_rollout``, which returns a
``FinishedRollout``: how it ended (``termination_reason_for``, the one classifier), the
trajectory, the verl fields of a token engine's exact trace cut at the response length, whether
that cut truncated it, and the metrics. Each consumer keeps only what is its own: the verl loop
drops or masks what is not ``scored`` (infrastructure, cancelled), the local trainer raises on it,
the workflow builds the ``Episode`` (unscored for it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from strands.models.model import Model

from rllm.engine.rollout.base import RolloutEngine
from rllm.errors import RolloutWithoutTokensError
from rllm.integrations.strands.agent import StrandsAgent
from rllm.integrations.strands.hooks import Budget
from rllm.integrations.strands.model import RLLMModel
from rllm.integrations.strands.termination import describe_failure, termination_reason_for
from rllm.types import TerminationReason, Trajectory

logger = logging.getLogger(__name__)


def build_agent(
    model: Model | RolloutEngine,
    *,
    tools: list[Any],
    system_prompt: str | None,
    budget: Budget | None = None,
    **agent_kwargs: Any,
) -> StrandsAgent:
    """The ``StrandsAgent`` a rollout runs: ``model`` (an engine gets a fresh ``RLLMModel``), tools, prompt, budget.

    The rollout defaults (no printing, ``NullConversationManager``, retries left to the engine)
    are ``StrandsAgent``'s; ``agent_kwargs`` (``name``, ``infra_exceptions``, hooks, ...) go to it.
    """
    if not isinstance(model, Model):
        model = RLLMModel(model)
    return StrandsAgent(model, tools=tools, system_prompt=system_prompt, budget=budget, **agent_kwargs)


def final_answer_text(trajectory: Trajectory) -> str:
    """The model's final answer: the text of the last model call, unless that call asked for tools.

    A run stopped by the budget right after a tool round has no final answer, so "" is returned
    rather than the Strands stop notice or a tool result.
    """
    if not trajectory.steps:
        return ""
    last = trajectory.steps[-1]
    if last.tool_calls:
        return ""
    return last.model_output.text


@dataclass(frozen=True)
class RolloutEnd:
    """What a finished rollout says.

    Attributes:
        reason: Why it ended.
        failure: ``"ExceptionType: message"`` of what its invocation raised, or for an unscored end
            without an exception (a tool backend's failure, a cancel) its description; "" otherwise.
        final_answer: The final answer of a rollout that finished; "" for any other.
    """

    reason: TerminationReason
    failure: str
    final_answer: str

    @property
    def infra_failure(self) -> bool:
        """Whether it ended on infrastructure (retried, masked, never scored)."""
        return self.reason.is_infrastructure_failure

    @property
    def scored(self) -> bool:
        """Whether it is the policy's outcome, to score and train on: neither infrastructure nor cancelled."""
        return self.reason.is_scored


def read_rollout(agent: StrandsAgent, error: BaseException | None = None) -> RolloutEnd:
    """Read the end of the agent's last run; ``error`` is what its invocation raised, if anything."""
    reason = (agent.termination_reason or TerminationReason.ERROR) if error is None else termination_reason_for(error)
    failure = ""
    if error is not None:
        failure = describe_failure(error)
    elif not reason.is_scored:
        failure = agent.tool_failures.description or reason.value
    answer = final_answer_text(agent.trajectory) if reason is TerminationReason.FINISHED and error is None else ""
    return RolloutEnd(reason=reason, failure=failure, final_answer=answer)


def trajectory_metrics(trajectory: Trajectory) -> dict[str, float]:
    """Turns, tool calls, refused tool calls and token counts of one trajectory."""
    steps = trajectory.steps
    return {
        "turns": float(len(steps)),
        "tool_calls": float(sum(len(step.tool_calls) for step in steps)),
        "tool_errors": float(trajectory.num_tool_errors),
        "prompt_tokens": float(sum(step.model_output.usage.get("prompt_tokens", 0) for step in steps)),
        "completion_tokens": float(sum(step.model_output.usage.get("completion_tokens", 0) for step in steps)),
    }

@dataclass(frozen=True)
class FinishedRollout:
    """A finished rollout, as evaluation and training read it.

    Attributes:
        end: How it ended: reason, failure, final answer.
        error: What the agent's run raised, if anything (kept so a consumer can raise it with its cause).
        trajectory: The agent's recorded steps (the agent keeps it; a pooled agent's ``reset`` replaces it).
        fields: ``TokenTrace.to_verl(response_length)`` of a token engine's trace (prompt_ids,
            response_ids, response_mask, response_logprobs, num_turns); ``None`` without a token
            engine or when the run stopped before its first model call.
        truncated: The response was cut at ``response_length``: ran past it (``fields`` cut there), or
            filled it and ended by the token budget.
        num_model_calls: Sampled turns in the token trace (0 without one).
        metrics: ``trajectory_metrics`` plus ``latency_s``.
    """

    end: RolloutEnd
    error: BaseException | None
    trajectory: Trajectory
    fields: dict[str, Any] | None = None
    truncated: bool = False
    num_model_calls: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def raise_if_unexpected(self) -> None:
        """Raise what ended the run when it is neither a policy outcome nor typed infrastructure.

        Training calls this: a bug or a misconfiguration would end every rollout the same way, so
        it must stop the step with its cause, never be trained around.
        """
        if self.end.reason is not TerminationReason.ERROR:
            return
        logger.error("rollout failed with %s; not an infrastructure failure, so it is raised", self.end.failure)
        if self.error is not None:
            raise self.error
        raise RuntimeError(f"the rollout ended with an error: {self.end.failure}")

    def token_fields(self) -> dict[str, Any]:
        """``fields``, or ``RolloutWithoutTokensError`` when the run never reached its first model call."""
        if self.fields is None:
            raise RolloutWithoutTokensError(
                f"the agent stopped before its first model call: {self.end.failure}") from self.error
        return self.fields


def _truncated(response: int, response_length: int | None, reason: TerminationReason) -> bool:
    """Whether the response was cut at ``response_length``: longer than it, or filling it and ended by the budget."""
    if response_length is None:
        return False
    return response > response_length or (response == response_length and reason is TerminationReason.MAX_TOKENS)


async def run_rollout(
    agent: StrandsAgent, prompt: Any, *, timeout_s: float | None = None, response_length: int | None = None,
) -> FinishedRollout:
    """Run ``agent`` on ``prompt`` and read everything training and evaluation need from it.

    Every exception of the run is caught and classified (``FinishedRollout.end``) and kept in
    ``error``, so that training can raise what is neither a policy outcome nor infrastructure
    (``raise_if_unexpected``) and evaluation can keep it in the episode. ``timeout_s`` bounds the
    run (a run past it is ``TIMEOUT``, infrastructure). ``response_length`` cuts the exported
    token fields (verl's ``rollout.response_length``); ``None`` exports the whole response.
    """
    error: BaseException | None = None
    started = time.perf_counter()
    try:
        if timeout_s is None:
            await agent.invoke_async(prompt)
        else:
            await asyncio.wait_for(agent.invoke_async(prompt), timeout=timeout_s)
    except Exception as caught:  # noqa: BLE001 - classified here; the consumer decides what to raise
        error = caught
    latency = time.perf_counter() - started
    end = read_rollout(agent, error)
    trajectory = agent.trajectory
    metrics = {**trajectory_metrics(trajectory), "latency_s": latency}
    trace = trajectory.token_trace
    if trace is None:
        return FinishedRollout(end=end, error=error, trajectory=trajectory, metrics=metrics)
    return FinishedRollout(
        end=end,
        error=error,
        trajectory=trajectory,
        fields=trace.to_verl(response_length),
        truncated=_truncated(len(trace) - trace.prompt_length, response_length, end.reason),
        num_model_calls=trace.num_turns,
        metrics=metrics,
    )
