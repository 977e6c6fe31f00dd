"""One runner for evaluation and training: how a rollout's agent is built and what a finished rollout says.

``StrandsWorkflow`` (evaluation, batch rollouts) and the verl ``StrandsAgentLoop`` (training) run
the same agent: both build it with ``build_agent`` and read its end with ``read_rollout`` (the
termination reason, the failure if there was one, the final answer), so both score the same thing.
A token engine's exact tokens are the agent's ``trajectory.token_trace`` in both.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from strands.models.model import Model

from rllm.engine.rollout.base import RolloutEngine
from rllm.errors import ResponseBudgetExhaustedError, exception_chain
from rllm.integrations.strands.agent import StrandsAgent, describe_failure, termination_reason_for
from rllm.integrations.strands.hooks import Budget
from rllm.integrations.strands.model import RLLMModel
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


def rollout_termination(agent: StrandsAgent, error: BaseException | None = None) -> TerminationReason:
    """Why the agent's run ended: ``error`` (what its invocation raised, if anything) classified, else the agent's reason.

    A response budget used up (``ResponseBudgetExhaustedError`` anywhere behind ``error``) is
    ``MAX_TOKENS``; see ``termination_reason_for`` for the rest.
    """
    if error is None:
        return agent.termination_reason or TerminationReason.ERROR
    if any(isinstance(cause, ResponseBudgetExhaustedError) for cause in exception_chain(error)):
        return TerminationReason.MAX_TOKENS
    return termination_reason_for(error)


async def run_token_rollout(agent: StrandsAgent, prompt: Any, *, timeout_s: float | None = None) -> BaseException | None:
    """Run a token-engine rollout's agent on ``prompt``; what its run raised, when that is an outcome to record.

    A policy outcome (budget, context, response length) or a typed infrastructure failure is
    returned, for ``read_rollout``; anything else is raised with its cause, since it would end
    every rollout the same way. A run that stopped before its first model call (no token trace
    to train on) raises ``RuntimeError``. ``timeout_s`` bounds the run (``asyncio.TimeoutError``
    is an infrastructure failure).
    """
    error: BaseException | None = None
    try:
        if timeout_s is None:
            await agent.invoke_async(prompt)
        else:
            await asyncio.wait_for(agent.invoke_async(prompt), timeout=timeout_s)
    except Exception as caught:  # noqa: BLE001 - typed below; anything untyped is raised
        if rollout_termination(agent, caught) is TerminationReason.ERROR:
            logger.error("rollout failed with %s: %s; not an infrastructure failure, so it is raised",
                         type(caught).__name__, caught)
            raise
        error = caught
    if agent.trajectory.token_trace is None:
        raise RuntimeError(f"the agent stopped before its first model call: {error!r}") from error
    return error


@dataclass(frozen=True)
class RolloutEnd:
    """What a finished rollout says.

    Attributes:
        reason: Why it ended.
        failure: ``"ExceptionType: message"`` of what its invocation raised, or for an
            infrastructure failure without an exception (a tool backend) its description; "" otherwise.
        final_answer: The final answer of a rollout that finished; "" for any other.
    """

    reason: TerminationReason
    failure: str
    final_answer: str

    @property
    def infra_failure(self) -> bool:
        """Whether it ended on infrastructure (retried, masked, never scored)."""
        return self.reason.is_infrastructure_failure


def read_rollout(agent: StrandsAgent, error: BaseException | None = None) -> RolloutEnd:
    """Read the end of the agent's last run; ``error`` is what its invocation raised, if anything."""
    reason = rollout_termination(agent, error)
    failure = ""
    if error is not None:
        failure = describe_failure(error)
    elif reason.is_infrastructure_failure:
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
