"""A rollout's record: an agent run once and read into a ``FinishedRollout``, what evaluation and training read.

``run_rollout`` runs an agent that carries a recorder (a ``StrandsAgent``, or any Strands ``Agent``
after ``record(agent)``) and returns a ``FinishedRollout``: how it ended (``termination_reason_for``,
the one classifier), the trajectories (one per sample: a rewritten history starts a new one), the
verl fields of each sample's exact trace cut at the response length, whether a cut truncated one, and
the metrics. Every runner builds its record with ``finished_rollout`` (a team's in ``teams.py``, an
agent on its own client's in ``traced.py``); what builds and runs a rollout's agent for a door is
``runner.py``. Each consumer keeps only what is its own: the verl loop drops or masks what is not
``scored`` (infrastructure, cancelled), the local trainer raises on it, the workflow builds the
``Episode`` (unscored for it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from strands import Agent
from strands.multiagent.base import MultiAgentBase

from rllm.errors import RolloutWithoutTokensError
from rllm.integrations.strands.agent import StrandsAgent
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.integrations.strands.termination import describe_failure, termination_reason_for
from rllm.types import TerminationReason, Trajectory

logger = logging.getLogger(__name__)


def final_answer_text(trajectory: Trajectory) -> str:
    """The model's final answer: the text of the last model call, unless that call asked for tools.

    A run stopped by the budget right after a tool round has no final answer, so "" is returned
    rather than the Strands stop notice or a tool result.
    """
    steps = [step for step in trajectory.steps if not step.info.get("side_call")]
    if not steps:
        return ""
    last = steps[-1]
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
        """Whether it is the policy's outcome, to score and train on: not infrastructure, cancelled or an error."""
        return self.reason.is_scored


def read_rollout(recorder: RolloutRecorder, error: BaseException | None = None,
                 stop_reason: str | None = None) -> RolloutEnd:
    """Read the end of an agent's last run from its recorder; ``error`` is what the run raised, if anything.

    ``stop_reason`` is the run's ``AgentResult.stop_reason`` (``None`` when it raised).
    """
    if error is None:
        reason = recorder.termination_reason(stop_reason) or TerminationReason.ERROR
    else:
        reason = termination_reason_for(error)
    failure = ""
    if error is not None:
        failure = describe_failure(error)
    elif not reason.is_scored:
        failure = recorder.tool_failures.description or reason.value
    finished = reason is TerminationReason.FINISHED and error is None
    agent_steps = [t for t in recorder.trajectories if any(not s.info.get("side_call") for s in t.steps)]
    answer = final_answer_text((agent_steps or recorder.trajectories)[-1]) if finished else ""
    return RolloutEnd(reason=reason, failure=failure, final_answer=answer)


def trajectory_metrics(trajectories: Trajectory | list[Trajectory]) -> dict[str, float]:
    """Turns, side calls, discarded answers, tool calls (refused, malformed), token counts and samples.

    ``turns`` counts the agent's own model calls; ``side_calls`` the calls Strands made on its model
    outside the agent loop (a context manager's summary), trained as steps of their own;
    ``discarded_answers`` the answers the agent threw away (never trained); ``malformed_tool_calls``
    the tool calls the parser could not read.
    """
    trajectories = [trajectories] if isinstance(trajectories, Trajectory) else trajectories
    steps = [step for trajectory in trajectories for step in trajectory.steps]
    side_calls = sum(1 for step in steps if step.info.get("side_call"))
    return {
        "turns": float(len(steps) - side_calls),
        "side_calls": float(side_calls),
        "discarded_answers": float(sum(t.info.get("discarded_answers", 0) for t in trajectories)),
        "samples": float(len(trajectories)),
        "tool_calls": float(sum(len(step.tool_calls) for step in steps)),
        "tool_errors": float(sum(t.num_tool_errors for t in trajectories)),
        "malformed_tool_calls": float(sum(1 for step in steps for call in step.tool_calls if call.error is not None)),
        "prompt_tokens": float(sum(step.model_output.usage.get("prompt_tokens", 0) for step in steps)),
        "completion_tokens": float(sum(step.model_output.usage.get("completion_tokens", 0) for step in steps)),
    }

@dataclass(frozen=True)
class FinishedRollout:
    """A finished rollout, as evaluation and training read it.

    Attributes:
        end: How it ended: reason, failure, final answer.
        error: What the agent's run raised, if anything (kept so a consumer can raise it with its cause).
        trajectories: The agent's recorded steps, one trajectory per sample (the agent keeps them; a
            pooled agent's ``reset`` replaces them; a traced agent's are read from the trace store).
        samples: ``TokenTrace.to_verl(response_length)`` of each sample a token engine recorded
            (prompt_ids, response_ids, response_mask, response_logprobs, num_turns), in order; a
            sample its run never sampled in is left out unless it is the only one. Empty without
            token ids (no token engine, a backend that returns none) or when the run stopped before
            its first model call.
        sample_names: The name of the trajectory each sample is (a team's node id), in ``samples``' order.
        truncated: The rollout's response was cut at ``response_length``: a sample ran past it (its
            fields cut there), or its samples together ran past it or filled it and ended by the
            token budget (a split rollout that used up the budget is truncated as an unsplit one).
        num_model_calls: Sampled turns over all samples (0 without a token engine).
        metrics: ``trajectory_metrics`` plus ``latency_s`` and ``rewritten_calls`` (calls whose history
            was rewritten, over the token sessions).
        token_sessions: Every token session the rollout sampled in (one per agent, a team node's
            each; the policy server's for an agent on its own client), in order.
        generation_seconds: Wall time its engines spent generating (``TokenSession.generate_seconds``).
        tool_seconds: Wall time its agents spent in tools (Strands' ``event_loop_metrics``).
        num_preempted: Preemptions the serving backend reported (-1: none reported).
    """

    end: RolloutEnd
    error: BaseException | None
    trajectories: list[Trajectory]
    samples: list[dict[str, Any]] = field(default_factory=list)
    sample_names: list[str] = field(default_factory=list)
    truncated: bool = False
    num_model_calls: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    token_sessions: list[Any] = field(default_factory=list)
    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    num_preempted: int = -1

    @property
    def trajectory(self) -> Trajectory:
        """The last sample's trajectory (the one with the final answer)."""
        return self.trajectories[-1]

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

    def token_samples(self) -> list[dict[str, Any]]:
        """``samples``, or ``RolloutWithoutTokensError`` when there are none to train on.

        None: the run never reached its first model call, or its model returned no token ids.
        """
        if not self.samples:
            calls = int(self.metrics.get("turns", 0) + self.metrics.get("side_calls", 0))
            if calls:
                raise RolloutWithoutTokensError(
                    f"none of the rollout's {calls} model calls came with token ids (an engine or a backend that "
                    "returns none, e.g. an OpenAI-compatible API other than vLLM): nothing to train on") from self.error
            raise RolloutWithoutTokensError(
                f"the agent stopped before its first model call: {self.end.failure}") from self.error
        return self.samples


def _truncated(responses: list[int], response_length: int | None, reason: TerminationReason) -> bool:
    """Whether the rollout's response was cut at ``response_length``, its samples' responses counted together.

    A sample longer than the budget (its fields cut there), the samples together longer than it, or
    together filling it and ended by the budget: the budget is the rollout's (``VerlEngine`` counts
    every sample of every session against it), so a split rollout that used it up is cut as an
    unsplit one is.
    """
    if response_length is None:
        return False
    total = sum(responses)
    return (any(response > response_length for response in responses) or total > response_length
            or (total == response_length and reason is TerminationReason.MAX_TOKENS))


async def run_rollout(
    agent: Agent, prompt: Any, *, recorder: RolloutRecorder | None = None, timeout_s: float | None = None,
    response_length: int | None = None,
) -> FinishedRollout:
    """Run ``agent`` on ``prompt`` and read everything training and evaluation need from it.

    ``agent`` is a ``StrandsAgent`` (its own recorder) or any Strands ``Agent`` with the recorder
    ``record(agent)`` attached to it once. Every exception of the run is caught and classified
    (``FinishedRollout.end``) and kept in ``error``, so that training can raise what is neither a
    policy outcome nor infrastructure (``raise_if_unexpected``) and evaluation can keep it in the
    episode; a tool's ``ConfigurationError`` is raised from the run, whatever the agent's class.
    ``timeout_s`` bounds the run (a run past it is ``TIMEOUT``, infrastructure). ``response_length``
    cuts the exported token fields (verl's ``rollout.response_length``); ``None`` exports the whole
    response.
    """
    recorder = rollout_recorder(agent, recorder, "run_rollout")
    end, error, latency = await invoke_agent(agent, prompt, recorder, timeout_s)
    return finished_rollout(end, error, list(recorder.trajectories), latency, response_length,
                            agents=[agent], token_sessions=recorder.token_sessions)


def rollout_recorder(agent: Agent, recorder: RolloutRecorder | None, caller: str) -> RolloutRecorder:
    """``recorder``, else a ``StrandsAgent``'s own; any other agent without one is refused (it records nothing)."""
    if recorder is not None:
        return recorder
    if not isinstance(agent, StrandsAgent):
        raise TypeError(f"{caller}: a {type(agent).__name__} records nothing by itself; attach a recorder "
                        "once with rllm.integrations.strands.record(agent) and pass it as recorder=")
    return agent.recorder


async def invoke_agent(agent: Agent, prompt: Any, recorder: RolloutRecorder,
                       timeout_s: float | None) -> tuple[RolloutEnd, BaseException | None, float]:
    """Run the agent once, catching and classifying what it raised: its end, the error and the latency in s."""
    error: BaseException | None = None
    stop_reason: str | None = None
    started = time.perf_counter()
    try:
        if timeout_s is None:
            result = await agent.invoke_async(prompt)
        else:
            result = await asyncio.wait_for(agent.invoke_async(prompt), timeout=timeout_s)
        stop_reason = result.stop_reason
        if recorder.tool_failures.fatal is not None:  # a StrandsAgent raised it already
            raise recorder.tool_failures.fatal
    except Exception as caught:  # noqa: BLE001 - classified here; the consumer decides what to raise
        error = caught
    return read_rollout(recorder, error, stop_reason), error, time.perf_counter() - started


def _tool_seconds(agents: list[Agent]) -> float:
    """Wall time the agents spent in tools, from Strands' ``event_loop_metrics``."""
    return float(sum(m.total_time for a in agents for m in a.event_loop_metrics.tool_metrics.values()))


def finished_rollout(end: RolloutEnd, error: BaseException | None, trajectories: list[Trajectory], latency: float,
                     response_length: int | None, *, agents: list[Agent] | None = None,
                     token_sessions: list[Any] | None = None) -> FinishedRollout:
    """The ``FinishedRollout`` of a run's trajectories: metrics, and the verl fields of every sample.

    Every runner builds its record here (an agent's, a team's, a traced agent's from the trace store);
    ``agents`` are what ran (their tool time), ``token_sessions`` where they sampled.
    """
    sessions = list(token_sessions or [])
    metrics = {**trajectory_metrics(trajectories), "latency_s": latency,
               "rewritten_calls": float(sum(getattr(s, "rewritten_calls", 0) for s in sessions))}
    record = FinishedRollout(
        end=end, error=error, trajectories=trajectories, metrics=metrics, token_sessions=sessions,
        generation_seconds=float(sum(getattr(s, "generate_seconds", 0.0) for s in sessions)),
        tool_seconds=_tool_seconds(list(agents or [])),
        num_preempted=max((int(getattr(s, "num_preempted", -1)) for s in sessions), default=-1))
    traced = [(t.name, t.token_trace) for t in trajectories if t.token_trace is not None]
    kept = [(name, trace) for name, trace in traced if trace.num_turns] or traced[:1]
    sampled = [trace for _, trace in kept]
    if not sampled:
        return record
    return dataclasses.replace(
        record,
        samples=[trace.to_verl(response_length) for trace in sampled],
        sample_names=[name for name, _ in kept],
        truncated=_truncated([len(t) - t.prompt_length for t in sampled], response_length, end.reason),
        num_model_calls=sum(trace.num_turns for trace in sampled),
        metrics=metrics,
    )


Built = Agent | MultiAgentBase
"""What an agent factory returns: a Strands ``Agent``, or a ``Swarm`` or ``Graph`` of agents."""


def built_agents(built: Built) -> list[Agent]:
    """The agent, or every agent node of a team."""
    if isinstance(built, Agent):
        return [built]
    return [node.executor for node in getattr(built, "nodes", {}).values() if isinstance(node.executor, Agent)]
