"""``StrandsAgent``: a Strands ``Agent`` that records one ``Step`` per model call."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.telemetry import EventLoopMetrics

from rllm.errors import AbortUnsupportedError
from rllm.integrations.strands.hooks import Budget, BudgetHook, ToolFailureHook
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.types import TerminationReason, Trajectory

logger = logging.getLogger(__name__)

class StrandsAgent(Agent):
    """A Strands ``Agent`` whose every model call lands in ``agent.trajectories`` as a ``Step``.

    Recording works through hooks and ``invocation_state``, so it holds for ``__call__``,
    ``invoke_async`` and ``stream_async`` alike and never crosses between agents that share a
    model. Defaults suit rollouts: no console printing, ``NullConversationManager`` (a manager that
    rewrites the history is allowed: with a token engine each rewrite starts a new sample, one
    trajectory each), and no Strands-level model retries (the engine retries infrastructure
    failures itself). ``reset()`` returns the agent to its freshly built state so pooled agents
    behave exactly like new ones.

    Args:
        model: Any Strands model; ``RLLMModel`` and ``NonStreamingOpenAIModel`` record token ids
            and logprobs when their engine returns them.
        tools: Tools, as for ``Agent``.
        system_prompt: System prompt, as for ``Agent``.
        name: The agent's name (Strands' ``Agent.name``, which ``Swarm`` and ``Graph`` use as its
            node id) and the name of its recorded trajectories.
        budget: Per-episode limits on model turns, tool rounds and tool calls.
        validate_tool_calls: Refuse unknown tools, non-JSON arguments and missing arguments.
        infra_exceptions: Exception classes that, raised by a tool, mean its backend failed, in
            addition to ``rllm.errors.InfrastructureError`` (see ``ToolFailureHook``).
        **kwargs: Passed to ``Agent``.

    A model call cancelled in flight (``agent.cancel()``) is recorded as a ``Step`` with stop reason
    ``cancelled`` and nothing sampled (finish reason ``cancelled``). A run that ends cancelled, also
    when the cancel came while a tool ran, has ``termination_reason`` ``CANCELLED``. ``cancel()``
    raises ``AbortUnsupportedError`` when the model's engine cannot abort a request in flight
    (``VerlEngine``) rather than leave the generation running unseen.

    A tool raising an ``InfrastructureError`` ends the run after that tool round with
    ``termination_reason`` ``TOOL_BACKEND_ERROR``; a tool raising a ``ConfigurationError`` ends it
    likewise and the run then raises that error, so it is never scored as the policy's mistake.
    """

    def __init__(
        self,
        model: Any,
        tools: list[Any] | None = None,
        system_prompt: str | None = None,
        *,
        name: str = "agent",
        budget: Budget | None = None,
        validate_tool_calls: bool = True,
        infra_exceptions: tuple[type[BaseException], ...] = (),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("callback_handler", None)
        kwargs.setdefault("conversation_manager", NullConversationManager())
        kwargs.setdefault("retry_strategy", None)
        self._recorder = RolloutRecorder(name, budget=budget, validate_tool_calls=validate_tool_calls,
                                         infra_exceptions=infra_exceptions)
        super().__init__(
            model=model,
            tools=tools,
            system_prompt=system_prompt,
            name=name,
            hooks=[*self._recorder.hooks, *(kwargs.pop("hooks", None) or [])],
            **kwargs,
        )
        self._last_stop_reason: str | None = None
        self._initial_snapshot = self.take_snapshot(
            include=["messages", "state", "conversation_manager_state", "interrupt_state", "system_prompt",
                     "model_state"]
        )

    @property
    def recorder(self) -> RolloutRecorder:
        """What this agent records: steps per sample, token session, budget, tool failures."""
        return self._recorder

    @property
    def trajectory(self) -> Trajectory:
        """The current sample's trajectory: every step since the last ``reset()`` unless the history was rewritten."""
        return self._recorder.trajectories[-1]

    @property
    def trajectories(self) -> list[Trajectory]:
        """One trajectory per sample since the last ``reset()``, in order (see ``TokenSession.samples``)."""
        return self._recorder.trajectories

    @property
    def token_session(self) -> Any:
        """The rollout's ``TokenSession`` when a token engine runs the agent (``None`` otherwise or before a call).

        The agent owns it: the model creates it in the agent's model state on the first call, and
        ``reset()`` drops it. Its samples are the ``token_trace`` of ``trajectories``.
        """
        return self._recorder.token_session

    @property
    def budget_hook(self) -> BudgetHook:
        """The hook enforcing this agent's budget, with its counters."""
        return self._recorder.budget_hook

    @property
    def tool_failures(self) -> ToolFailureHook:
        """The hook typing tool exceptions, with the episode's tool failure if there was one."""
        return self._recorder.tool_failures

    @property
    def termination_reason(self) -> TerminationReason | None:
        """Why the last run stopped, or ``None`` before any model call."""
        return self._recorder.termination_reason(self._last_stop_reason)

    def cancel(self, *, message: str | None = None, after_current_tools: bool = False) -> None:
        """``Agent.cancel``, refused (``AbortUnsupportedError``) where the engine cannot abort the request in flight.

        ``after_current_tools=True`` stops before the next model call, so it never needs an abort.
        """
        why = getattr(self.model, "abort_unsupported", None)
        if why and not after_current_tools:
            raise AbortUnsupportedError(
                f"agent.cancel() cannot stop this agent's model call: {why}. Let the rollout finish (bound it with a "
                "timeout), or use agent.cancel(after_current_tools=True), which stops before the next model call"
            )
        super().cancel(message=message, after_current_tools=after_current_tools)

    async def stream_async(self, prompt: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        """``Agent.stream_async`` (which ``invoke_async`` and ``__call__`` run), then a tool's ``ConfigurationError``.

        Keeps the run's stop reason (for ``termination_reason``). The ``ConfigurationError`` a tool
        raised is raised once its tool round is recorded.
        """
        self._last_stop_reason = None
        async for event in super().stream_async(prompt, **kwargs):
            if isinstance(event, dict) and "result" in event:
                self._last_stop_reason = getattr(event["result"], "stop_reason", None)
            yield event
        fatal = self._recorder.tool_failures.fatal
        if fatal is not None:
            raise fatal

    def reset(self) -> None:
        """Clear messages, trajectory, counters, state and model state for a new task."""
        self.load_snapshot(self._initial_snapshot)
        self.event_loop_metrics = EventLoopMetrics()
        self._recorder.reset()
        self._last_stop_reason = None
