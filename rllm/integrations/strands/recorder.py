"""``RolloutRecorder``: what rllm records of any Strands agent's run, attached with its hooks.

One ``Step`` per model call, in one ``Trajectory`` per sample (a rewritten history starts a new one:
``TokenSession.samples``), the rollout's token session, the budget and the tool failures, and from
them why the run ended. ``StrandsAgent`` carries one; ``record(agent)`` attaches one to an agent a
user built (their own ``Agent``, its class, hooks and conversation manager), which is how an agent
factory's agents are trained and evaluated.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from strands import Agent
from strands.hooks import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)
from strands.types.content import Message

from rllm.integrations.strands._cancel import CANCELLED, cancelled_output
from rllm.integrations.strands._format import format_messages, format_tools
from rllm.integrations.strands._turns import TurnMark, take_back
from rllm.integrations.strands.hooks import Budget, BudgetHook, ToolCallValidator, ToolFailureHook
from rllm.integrations.strands.run_state import (
    TOKEN_SESSION_KEY,
    ModelCall,
    RunState,
    end_run,
    receive_token_session,
    receive_tool_errors,
    start_run,
    take_model_call,
)
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
    A side call on the agent's model during its run (a context manager's summary) is a step too,
    marked ``info["side_call"] = True``. An answer the agent discarded (a hook asked Strands to call
    the model again, so it never entered the history) loses its step and its tokens are taken back
    from the session (``_turns.take_back``), counted in its trajectory's ``info["discarded_answers"]``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.trajectories = [Trajectory(name=name)]
        self.token_session: Any = None
        self.sessions: list[Any] = []
        self.last_error: BaseException | None = None
        self._call_cancelled = False
        self._pending: tuple[Step, TurnMark | None] | None = None
        self._runs: list[Any] = []

    @property
    def trajectory(self) -> Trajectory:
        """The current sample's trajectory (the only one unless the history was rewritten)."""
        return self.trajectories[-1]

    def reset(self) -> None:
        self.trajectories = [Trajectory(name=self.name)]
        self.token_session = None
        self.sessions = []
        self.last_error = None
        self._pending = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._before_invocation)
        registry.add_callback(AfterInvocationEvent, self._after_invocation)
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)
        registry.add_callback(AfterModelCallEvent, self._after_model_call)
        registry.add_callback(MessageAddedEvent, self._message_added)

    def _before_invocation(self, event: BeforeInvocationEvent) -> None:
        """Open the run: side calls on the agent's model go to its session and its steps until it ends."""
        known = {TOKEN_SESSION_KEY: self.token_session} if self.token_session is not None else None
        run = RunState(agent=event.agent, receive_session=self._receive_token_session,
                       receive_side_call=self._record_side_call, model_state=known)  # until its first call
        self._runs.append(start_run(run))

    def _after_invocation(self, event: AfterInvocationEvent) -> None:
        """Close the run: an answer still not in the history was discarded; nothing of the run outlives it."""
        self._discard_pending()
        if self._runs:
            end_run(self._runs.pop())

    def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        # A call cancelled by a hook (the budget) never reaches the model: nothing to record.
        self._discard_pending()  # the previous answer never entered the history: Strands calls the model again
        self._call_cancelled = bool(event.cancel)
        receive_token_session(event.invocation_state, self._receive_token_session)
        receive_tool_errors(event.invocation_state, self.record_tool_error)

    def _receive_token_session(self, session: Any) -> None:
        """The rollout's token state, handed over by the model before its engine runs.

        A second session in one episode (a ``Swarm`` or ``Graph`` resetting a node's model state
        before it runs again) continues after the samples of the first.
        """
        if session is not self.token_session:
            self.sessions.append(session)
        self.token_session = session
        self._follow_samples()

    def _follow_samples(self) -> None:
        """One trajectory per sample of the episode's token sessions, each holding its sample's trace."""
        if getattr(self.token_session, "samples", None) is None:
            return
        samples = [sample for session in self.sessions for sample in session.samples]
        while len(self.trajectories) > len(samples) and not self.trajectories[-1].steps:
            self.trajectories.pop()  # a sample its call took back (cancelled, aborted, overflowing)
        for index, trace in enumerate(samples):
            if index == len(self.trajectories):
                self.trajectories.append(Trajectory(name=self.name))
            self.trajectories[index].token_trace = trace
            self.trajectories[index].info["sample"] = index

    def last_step(self) -> Step | None:
        """The latest recorded step of the agent (side calls left out), in whichever sample it is."""
        steps = (s for t in reversed(self.trajectories) for s in reversed(t.steps) if not s.info.get("side_call"))
        return next(steps, None)

    def _trajectory_of(self, turn: TurnMark | None) -> Trajectory:
        """The trajectory of the sample a turn was sampled in (the current one without a token engine)."""
        if turn is not None:
            found = next((t for t in self.trajectories if t.token_trace is turn.trace), None)
            if found is not None:
                return found
        return self.trajectory

    def _record_side_call(self, call: ModelCall) -> None:
        """A side call on the agent's model during its run: a step of the sample its tokens are in."""
        self._follow_samples()
        self._trajectory_of(call.turn).steps.append(
            Step(messages=call.messages, tools=call.tools, model_output=call.output,
                 stop_reason=call.output.finish_reason, info={"side_call": True})
        )

    def _discard_pending(self) -> None:
        """Forget the answer recorded last if the agent discarded it: its step, and its tokens from the session."""
        if self._pending is None:
            return
        step, turn = self._pending
        self._pending = None
        for trajectory in self.trajectories:
            if any(s is step for s in trajectory.steps):
                trajectory.steps = [s for s in trajectory.steps if s is not step]
        masked = turn is not None and not take_back(turn)
        self._follow_samples()
        info = self._trajectory_of(turn if masked else None).info
        info["discarded_answers"] = info.get("discarded_answers", 0) + 1
        logger.debug("the agent discarded an answer (%s)", "masked in place" if masked else "taken back")

    def _after_model_call(self, event: AfterModelCallEvent) -> None:
        call = take_model_call(event.invocation_state)
        self._follow_samples()
        if event.exception is not None:
            self.last_error = event.exception
            return
        if event.stop_response is None or self._call_cancelled:
            return
        if event.retry:  # asked for by a hook that ran before this one: the answer is discarded already
            self._pending = (Step(messages=[], model_output=ModelOutput()), call.turn if call is not None else None)
            self._discard_pending()
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
        step = Step(messages=call.messages, tools=call.tools, model_output=call.output,
                    stop_reason=event.stop_response.stop_reason)
        self._trajectory_of(call.turn).steps.append(step)
        self._pending = (step, call.turn)  # until its answer enters the history

    def _message_added(self, event: MessageAddedEvent) -> None:
        message = event.message
        if message["role"] == "assistant":
            self._pending = None
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


class RolloutRecorder:
    """Records an agent's rollout through hooks: steps per sample, token session, budget, tool failures.

    Args:
        name: Names the recorded trajectories (an agent's name).
        budget: Per-episode limits on model turns, tool rounds and tool calls.
        validate_tool_calls: Refuse unknown tools, non-JSON arguments and missing arguments.
        infra_exceptions: Exception classes that, raised by a tool, mean its backend failed, in
            addition to ``rllm.errors.InfrastructureError`` (see ``ToolFailureHook``).
        budget_hook: A ``BudgetHook`` shared with other recorders, instead of one of its own for
            ``budget``: a team's nodes count one budget for the whole episode (``record_team``).
    """

    def __init__(self, name: str, *, budget: Budget | None = None, validate_tool_calls: bool = True,
                 infra_exceptions: tuple[type[BaseException], ...] = (),
                 budget_hook: BudgetHook | None = None) -> None:
        if budget_hook is not None and budget is not None:
            raise TypeError("RolloutRecorder: give budget or a shared budget_hook, not both")
        self.steps = _StepRecorder(name)
        self.budget_hook = budget_hook or BudgetHook(budget or Budget())
        self.tool_failures = ToolFailureHook(tuple(infra_exceptions))
        self.hooks: list[HookProvider] = [self.budget_hook, self.steps, self.tool_failures]
        if validate_tool_calls:
            self.hooks.append(ToolCallValidator(self.steps.find_tool_call, self.steps.record_tool_error))

    def attach(self, agent: Agent) -> None:
        """Register the hooks on ``agent`` (after its own: they only watch, and the budget ends turns).

        Once per agent: an agent that has a recorder already is refused (``TypeError``, see ``record``).
        """
        if isinstance(getattr(agent, _ATTACHED, None), RolloutRecorder):
            raise TypeError(_ran_before(agent))
        for hook in self.hooks:
            agent.hooks.add_hook(hook)
        setattr(agent, _ATTACHED, self)

    @property
    def trajectories(self) -> list[Trajectory]:
        """One trajectory per sample since the last ``reset()``, in order."""
        return self.steps.trajectories

    @property
    def token_session(self) -> Any:
        """The rollout's ``TokenSession`` when a token engine runs the agent (``None`` otherwise or before a call)."""
        return self.steps.token_session

    @property
    def token_sessions(self) -> list[Any]:
        """Every token session of the episode, in order: one, unless a team reset the agent's model state."""
        return list(self.steps.sessions)

    def termination_reason(self, stop_reason: str | None) -> TerminationReason | None:
        """Why the run ended, given its last stop reason (``AgentResult.stop_reason``); ``None`` before any call."""
        if self.tool_failures.reason is not None:
            return self.tool_failures.reason
        if self.tool_failures.fatal is not None:
            return TerminationReason.ERROR
        if self.budget_hook.exhausted is not None:
            return self.budget_hook.exhausted
        if self.steps.last_error is not None:
            return termination_reason_for(self.steps.last_error)
        if stop_reason == CANCELLED:  # a cancel while tools ran leaves no cancelled step
            return TerminationReason.CANCELLED
        step = self.steps.last_step()
        if step is None:
            return None
        return termination_reason_for(stop_reason=step.stop_reason)

    def reset(self) -> None:
        """Forget the episode: steps, samples, session, counters (a shared budget's too), failures."""
        self.steps.reset()
        self.budget_hook.reset()
        self.tool_failures.reset()


# The attribute that marks an agent rllm records (set by ``RolloutRecorder.attach``).
_ATTACHED = "_rllm_recorder"


def _ran_before(agent: Agent) -> str:
    return (f"agent {agent.name!r} was recorded for an earlier rollout: an agent keeps its conversation, so this "
            "rollout would start inside that one's and train on it; build a new agent for every rollout")


def record(agent: Agent, *, name: str | None = None, budget: Budget | None = None, validate_tool_calls: bool = True,
           infra_exceptions: tuple[type[BaseException], ...] = (),
           budget_hook: BudgetHook | None = None) -> RolloutRecorder:
    """The recorder of ``agent``: a ``StrandsAgent``'s own, or a new one attached to any other ``Agent``.

    A ``StrandsAgent`` keeps its own name, budget and validation, so the arguments apply to other
    agents only. The trajectories are named ``name`` (a team's node id), else by the agent's name;
    ``budget_hook`` is a budget shared with other agents (a team's), instead of ``budget``.

    An agent recorded before (an agent factory handing back an earlier task's agent) is refused with
    ``TypeError``; so is a ``StrandsAgent`` whose recorder holds an episode not ``reset()`` since.
    """
    own = getattr(agent, "recorder", None)
    if isinstance(own, RolloutRecorder):
        if any(trajectory.steps for trajectory in own.trajectories):
            raise TypeError(_ran_before(agent))
        return own
    recorder = RolloutRecorder(name or str(agent.name), budget=budget, validate_tool_calls=validate_tool_calls,
                               infra_exceptions=infra_exceptions, budget_hook=budget_hook)
    recorder.attach(agent)
    return recorder
