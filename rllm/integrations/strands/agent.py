"""``StrandsAgent``: a Strands ``Agent`` that records one ``Step`` per model call."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterModelCallEvent, BeforeModelCallEvent, HookProvider, HookRegistry, MessageAddedEvent
from strands.telemetry import EventLoopMetrics
from strands.types.content import Message

from rllm.errors import AbortUnsupportedError
from rllm.integrations.strands._cancel import CANCELLED, cancelled_output
from rllm.integrations.strands._format import format_messages, format_tools
from rllm.integrations.strands.hooks import Budget, BudgetHook, ToolCallValidator, ToolFailureHook
from rllm.integrations.strands.recording import ModelCall, receive_token_session, receive_tool_errors, take_model_call
from rllm.integrations.strands.termination import termination_reason_for
from rllm.types import ModelOutput, Step, TerminationReason, ToolCall, Trajectory

logger = logging.getLogger(__name__)

def _output_from_message(message: Message) -> ModelOutput:
    """A ``ModelOutput`` rebuilt from a Strands message, for models that record no ``ModelCall``."""
    blocks = message["content"]
    reasoning = "".join(
        b["reasoningContent"].get("reasoningText", {}).get("text", "") for b in blocks if "reasoningContent" in b
    )
    return ModelOutput(
        text="".join(b["text"] for b in blocks if "text" in b),
        reasoning=reasoning or None,
        tool_calls=[
            ToolCall(
                id=str(b["toolUse"]["toolUseId"]),
                name=b["toolUse"]["name"],
                arguments=json.dumps(b["toolUse"]["input"], ensure_ascii=False),
                input=b["toolUse"]["input"] if isinstance(b["toolUse"]["input"], dict) else None,
            )
            for b in blocks
            if "toolUse" in b
        ],
    )


class _StepRecorder(HookProvider):
    """Appends a ``Step`` after every successful model call of its agent, to the trajectory of its sample.

    A token engine's rollout is one or more samples (``TokenSession.samples``: a rewritten history
    starts a new one); the recorder keeps one ``Trajectory`` per sample, each with that sample's
    ``token_trace`` and ``info["sample"]``, and records each call's step in the sample it extended.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.trajectories = [Trajectory(name=name)]
        self.token_session: Any = None
        self.last_error: BaseException | None = None
        self._call_cancelled = False

    @property
    def trajectory(self) -> Trajectory:
        """The current sample's trajectory (the only one unless the history was rewritten)."""
        return self.trajectories[-1]

    def reset(self) -> None:
        self.trajectories = [Trajectory(name=self.name)]
        self.token_session = None
        self.last_error = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)
        registry.add_callback(AfterModelCallEvent, self._after_model_call)
        registry.add_callback(MessageAddedEvent, self._message_added)

    def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        # A call cancelled by a hook (the budget) never reaches the model: nothing to record.
        self._call_cancelled = bool(event.cancel)
        receive_token_session(event.invocation_state, self._receive_token_session)
        receive_tool_errors(event.invocation_state, self.record_tool_error)

    def _receive_token_session(self, session: Any) -> None:
        """The rollout's token state, handed over by the model before its engine runs."""
        self.token_session = session
        self._follow_samples()

    def _follow_samples(self) -> None:
        """One trajectory per sample of the token session, each holding its sample's trace."""
        samples = getattr(self.token_session, "samples", None)
        if samples is None:
            return
        while len(self.trajectories) > len(samples) and not self.trajectories[-1].steps:
            self.trajectories.pop()  # a sample its call took back (cancelled, aborted, overflowing)
        for index, trace in enumerate(samples):
            if index == len(self.trajectories):
                self.trajectories.append(Trajectory(name=self.name))
            self.trajectories[index].token_trace = trace
            self.trajectories[index].info["sample"] = index

    def last_step(self) -> Step | None:
        """The latest recorded step, in whichever sample it is."""
        return next((t.steps[-1] for t in reversed(self.trajectories) if t.steps), None)

    def _after_model_call(self, event: AfterModelCallEvent) -> None:
        call = take_model_call(event.invocation_state)
        self._follow_samples()
        if event.exception is not None:
            self.last_error = event.exception
            return
        if event.stop_response is None or self._call_cancelled or event.retry:
            return
        agent = event.agent
        if call is None:  # a model that does not record its calls: rebuild what it was given
            cancelled = event.stop_response.stop_reason == CANCELLED  # the message is Strands' placeholder
            call = ModelCall(
                messages=format_messages(agent.messages, agent.system_prompt),
                tools=format_tools(agent.tool_registry.get_all_tool_specs()),
                output=cancelled_output() if cancelled else _output_from_message(event.stop_response.message),
            )
        self.last_error = None
        self.trajectory.steps.append(
            Step(
                messages=call.messages,
                tools=call.tools,
                model_output=call.output,
                stop_reason=event.stop_response.stop_reason,
            )
        )

    def _message_added(self, event: MessageAddedEvent) -> None:
        message = event.message
        step = self.last_step()
        if message["role"] == "user" and step is not None and any("toolResult" in b for b in message["content"]):
            step.observation = [m for m in format_messages([message]) if m["role"] == "tool"]

    def find_tool_call(self, tool_use_id: str) -> ToolCall | None:
        """The raw tool call with this id from the latest step."""
        step = self.last_step()
        if step is None:
            return None
        return next((c for c in step.tool_calls if c.id == tool_use_id), None)

    def record_tool_error(self, tool_use_id: str, name: str, error: str) -> None:
        """Note on the latest step that a call was refused, and why."""
        step = self.last_step()
        if step is not None:
            step.tool_errors.append({"id": tool_use_id, "name": name, "error": error})


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
        self._recorder = _StepRecorder(name)
        self._budget_hook = BudgetHook(budget or Budget())
        self._tool_failures = ToolFailureHook(tuple(infra_exceptions))
        own_hooks: list[Any] = [self._budget_hook, self._recorder, self._tool_failures]
        if validate_tool_calls:
            own_hooks.append(ToolCallValidator(self._recorder.find_tool_call, self._recorder.record_tool_error))
        super().__init__(
            model=model,
            tools=tools,
            system_prompt=system_prompt,
            name=name,
            hooks=[*own_hooks, *(kwargs.pop("hooks", None) or [])],
            **kwargs,
        )
        self._last_stop_reason: str | None = None
        self._initial_snapshot = self.take_snapshot(
            include=["messages", "state", "conversation_manager_state", "interrupt_state", "system_prompt",
                     "model_state"]
        )

    @property
    def trajectory(self) -> Trajectory:
        """The current sample's trajectory: every step since the last ``reset()`` unless the history was rewritten."""
        return self._recorder.trajectory

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
        return self._budget_hook

    @property
    def tool_failures(self) -> ToolFailureHook:
        """The hook typing tool exceptions, with the episode's tool failure if there was one."""
        return self._tool_failures

    @property
    def termination_reason(self) -> TerminationReason | None:
        """Why the last run stopped, or ``None`` before any model call."""
        if self._tool_failures.reason is not None:
            return self._tool_failures.reason
        if self._tool_failures.fatal is not None:
            return TerminationReason.ERROR
        if self._budget_hook.exhausted is not None:
            return self._budget_hook.exhausted
        if self._recorder.last_error is not None:
            return termination_reason_for(self._recorder.last_error)
        if self._last_stop_reason == CANCELLED:  # a cancel while tools ran leaves no cancelled step
            return TerminationReason.CANCELLED
        step = self._recorder.last_step()
        if step is None:
            return None
        return termination_reason_for(stop_reason=step.stop_reason)

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
        fatal = self._tool_failures.fatal
        if fatal is not None:
            raise fatal

    def reset(self) -> None:
        """Clear messages, trajectory, counters, state and model state for a new task."""
        self.load_snapshot(self._initial_snapshot)
        self.event_loop_metrics = EventLoopMetrics()
        self._budget_hook.reset()
        self._tool_failures.reset()
        self._recorder.reset()
        self._last_stop_reason = None
