"""``StrandsWorkflow``: a Strands agent per task, run with ``invoke_async`` and scored.

Either the workflow builds a ``StrandsAgent`` from tools, a system prompt and a budget (once per
instance over ``RLLMModel(rollout_engine)``, restored by ``reset()`` between tasks), or a user's
``agent_factory(model, task)`` builds any Strands ``Agent`` for each task over the workflow's
``RLLMModel`` (its own class, hooks, conversation manager, tools), to which a ``RolloutRecorder`` is
attached. With ``trace_store`` the factory's agent runs on its own traced client instead (through the
LiteLLM proxy that writes the store) and its rollout is read back from the store (``ThroughProxy``: the same
runner, ``rllm.integrations.strands.runner``, runs an agent on its own client in training).
Nothing here blocks the event loop, so a pool of N instances really runs N agents at once.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strands import Agent

from rllm.data.tasks import default_task_to_prompt
from rllm.engine.rollout.base import RolloutEngine
from rllm.integrations.strands import Budget, RLLMModel, RolloutRecorder
from rllm.integrations.strands.rollout import Built, FinishedRollout, trajectory_metrics
from rllm.integrations.strands.runner import (
    AgentChoice,
    AgentFactory,
    BuiltRollout,
    ClientRule,
    ThroughProxy,
    build_rollout,
    check_agent_choice,
)
from rllm.rewards.base import RewardOutput, score_answer
from rllm.tracing.store import TraceStore
from rllm.types import Episode, TerminationReason
from rllm.workflows.base import Workflow

logger = logging.getLogger(__name__)

__all__ = ["StrandsWorkflow", "default_task_to_prompt"]

_FIX = ("rllm does not record its calls: build it on the model it is given, or, for an agent on its own client "
        "through the tracing proxy, pass trace_store=")

TaskToPrompt = Callable[[dict[str, Any]], Any]
Tools = list[Any] | Callable[[], list[Any]]


class StrandsWorkflow(Workflow):
    """Runs a Strands agent on one task and scores its final answer.

    Args:
        rollout_engine: Engine behind the agent's ``RLLMModel``.
        tools: Strands tools, or a factory called once per instance for tools that hold
            per-agent state (a work directory, a session). Not with ``agent_factory``.
        system_prompt: The agent's system prompt. Not with ``agent_factory``.
        reward_fn: ``reward_fn(task, final_answer_text)`` returning a ``RewardOutput`` or a number (may
            be async); ``None`` leaves episodes unscored.
        agent_factory: ``agent_factory(model, task)`` returning any Strands ``Agent`` built on
            ``model`` (the workflow's ``RLLMModel``), or a ``Swarm`` or ``Graph`` of such agents (one
            episode, one trajectory per node and sample), called for every task; instead of ``tools``.
        trace_store: The ``TraceStore`` (or its path) of the LiteLLM proxy that the factory's agent calls
            through: the factory builds one ``Agent`` on its own traced client
            (``OpenAIModel(client=rllm.tracing.get_chat_client_async(proxy.base_url, proxy.api_key))``),
            not on ``model``, and each rollout is read back from the store. Only with ``agent_factory``.
        budget: Per-episode limits on model turns and tool calls (for a factory's agent too).
        task_to_prompt: Builds the user message from a task; default: its ``question``.
        model_kwargs: ``RLLMModel`` config (``params`` for sampling, ``model_id``, ...).
        agent_kwargs: Extra ``StrandsAgent`` arguments (``name``, ``validate_tool_calls``, hooks, ...).
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        *,
        tools: Tools | None = None,
        system_prompt: str | None = None,
        reward_fn: Callable[[dict[str, Any], str], Any] | None,
        agent_factory: AgentFactory | None = None,
        trace_store: TraceStore | str | Path | None = None,
        budget: Budget | None = None,
        task_to_prompt: TaskToPrompt | None = None,
        model_kwargs: dict[str, Any] | None = None,
        agent_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(rollout_engine)
        check_agent_choice("StrandsWorkflow", agent_factory=agent_factory, tools=tools, system_prompt=system_prompt,
                           agent_kwargs=agent_kwargs, trace_store=trace_store)
        self.reward_fn = reward_fn
        self.task_to_prompt = task_to_prompt or default_task_to_prompt
        self.model = RLLMModel(rollout_engine, **(model_kwargs or {}))
        self.agent_factory = agent_factory
        self.budget = budget
        self.trace_store = trace_store if trace_store is None or isinstance(trace_store, TraceStore) \
            else TraceStore(trace_store)
        self.choice = AgentChoice(
            agent_factory=agent_factory, system_prompt=system_prompt, budget=budget,
            agent_kwargs=dict(agent_kwargs or {}),
            client=ClientRule.MODEL if trace_store is None else ClientRule.TRACED,
            who="StrandsWorkflow: agent_factory" if trace_store is None else
                "StrandsWorkflow: with trace_store, agent_factory", fix=_FIX)
        self.built: Built | None = None  # from tools: built once, reset between tasks; from a factory: per task
        self.recorders: dict[str, RolloutRecorder] = {}
        if tools is not None:
            self.choice = dataclasses.replace(self.choice, tools=tools() if callable(tools) else list(tools))
            self._use(build_rollout(self.choice, self.model))

    @property
    def agent(self) -> Agent | None:
        """The agent that runs the current task (``None`` for a team, or before a factory has built one)."""
        return self.built if isinstance(self.built, Agent) else None

    def reset(self) -> None:
        """Restore the agent to its freshly built state (messages, trajectory, counters, token session).

        A factory's agent is built anew for every task instead.
        """
        if self.agent_factory is None:
            self.built.reset()  # type: ignore[union-attr]  # the StrandsAgent built from tools
        else:
            self.built, self.recorders = None, {}

    def _use(self, rollout: BuiltRollout) -> None:
        self.built, self.recorders = rollout.built, rollout.recorders

    async def _run_rollout(self, task: dict[str, Any]) -> FinishedRollout:
        """Build the task's agent or team (the factory's, or the one from tools) and run it (the runner)."""
        prompt = self.task_to_prompt(task)
        if self.agent_factory is None:
            assert self.built is not None
            return await BuiltRollout(self.built, self.recorders).run(prompt)
        self.built, self.recorders = None, {}
        rollout = build_rollout(self.choice, self.model, task)  # refuses an agent recorded for an earlier task
        self._use(rollout)
        own_client = None if self.trace_store is None else ThroughProxy(self.trace_store)
        return await rollout.run(prompt, own_client=own_client)

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        """Run the agent on ``task`` (``run_rollout``); a run that did not finish cleanly ends unscored with its reason.

        An unexpected error (``ERROR``: a bug, or a tool raising a ``ConfigurationError``) keeps
        its traceback in ``info``; an infrastructure failure (a tool backend, ``TOOL_BACKEND_ERROR``;
        a generation the server aborted, ``ENGINE_ERROR``) or a cancelled run (``CANCELLED``) is
        never scored, with the failure in ``info["error"]``.
        """
        finished = await self._run_rollout(task)
        end = finished.end
        if finished.error is not None or not end.scored:
            logger.debug("episode %s ended by %s: %s", uid, end.reason.value, end.failure)
            episode = self.failed_episode(task, uid, end.reason, end.failure)
            episode.trajectories = finished.trajectories  # the record's (a traced agent's from its store)
            if end.reason is TerminationReason.ERROR and finished.error is not None:
                episode.info["traceback"] = "".join(traceback.format_exception(finished.error))[-4000:]
            episode.metrics.update(finished.metrics)
            return episode
        trajectories = finished.trajectories
        info: dict[str, Any] = {"final_answer": end.final_answer}
        reward = RewardOutput(reward=0.0, is_correct=False, metadata={"reason": "no reward function"})
        if self.reward_fn is not None:
            reward = await score_answer(self.reward_fn, task, end.final_answer)
            info["reward"] = reward.metadata
        for trajectory in trajectories:  # one outcome for the rollout, whatever its samples
            trajectory.reward = reward.reward
        return Episode(
            id=uid,
            task=task,
            trajectories=trajectories,
            reward=reward.reward,
            is_correct=reward.is_correct,
            termination_reason=end.reason,
            metrics=dict(finished.metrics),
            info=info,
        )

    def failed_episode(
        self, task: dict[str, Any], uid: str, reason: TerminationReason, error: str | None = None
    ) -> Episode:
        """An unscored episode carrying the steps the agent recorded before it stopped."""
        episode = super().failed_episode(task, uid, reason, error)
        trajectories = [t for recorder in self.recorders.values() for t in recorder.trajectories]
        episode.trajectories = trajectories
        episode.metrics.update(trajectory_metrics(trajectories))
        episode.info["final_answer"] = ""
        return episode
