"""Strands hooks for rollouts: a budget, strict tool-call validation, an unparseable-call guard, tool-failure typing."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strands.hooks import (
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
)

from rllm.errors import ConfigurationError, InfrastructureError
from rllm.integrations.strands.run_state import record_malformed_calls, report_tool_error, take_malformed_call
from rllm.types import TerminationReason, ToolCall

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """Limits per episode; ``None`` means unlimited.

    Attributes:
        max_model_turns: Model calls.
        max_tool_iterations: Rounds of tool execution (one per assistant message with tool calls).
        max_tool_calls: Individual tool calls, counted across rounds.
    """

    max_model_turns: int | None = None
    max_tool_iterations: int | None = None
    max_tool_calls: int | None = None


class BudgetHook(HookProvider):
    """Ends the episode cleanly when a ``Budget`` limit is reached and records which one.

    A limit reached after a round of tools ends the turn there (no further model call); a tool
    call beyond ``max_tool_calls`` is refused with an error result. ``exhausted`` then holds the
    termination reason. Counters span invocations until ``reset()``.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.reset()

    def reset(self) -> None:
        """Zero the counters for a new episode."""
        self.model_turns = 0
        self.tool_iterations = 0
        self.tool_calls = 0
        self.exhausted: TerminationReason | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Subscribe to the model and tool events the budget counts."""
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def _exhaust(self, reason: TerminationReason) -> str:
        if self.exhausted is None:
            self.exhausted = reason
            logger.debug("budget exhausted: %s", reason.value)
        return f"Stopped: the episode's {self.exhausted.value} budget is exhausted."

    def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        limit = self.budget.max_model_turns
        if self.exhausted is not None or (limit is not None and self.model_turns >= limit):
            event.cancel = self._exhaust(TerminationReason.MAX_TURNS)
            return
        self.model_turns += 1

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        limit = self.budget.max_tool_calls
        if limit is not None and self.tool_calls >= limit:
            self._exhaust(TerminationReason.TOOL_BUDGET)
            event.cancel_tool = f"Error: the tool-call budget of {limit} calls is exhausted; tool not run."
            return
        self.tool_calls += 1

    def _after_tools(self, event: AfterToolsEvent) -> None:
        self.tool_iterations += 1
        if self.exhausted is None:
            if self.budget.max_tool_iterations is not None and self.tool_iterations >= self.budget.max_tool_iterations:
                self._exhaust(TerminationReason.TOOL_BUDGET)
            elif self.budget.max_model_turns is not None and self.model_turns >= self.budget.max_model_turns:
                self._exhaust(TerminationReason.MAX_TURNS)
        if self.exhausted is not None:
            event.end_turn = self._exhaust(self.exhausted)


def malformed_call_error(call: ToolCall, name: str) -> str:
    """The tool error the model reads for a call it wrote that could not be parsed (``call.error`` set)."""
    if not call.name:
        return f"Error: invalid tool call: {call.error}. Text received: {call.arguments[:500]}"
    return f"Error: invalid arguments for tool '{name}': {call.error}. Arguments received: {call.arguments[:500]}"


class MalformedCallGuard(HookProvider):
    """Refuses the tool calls a model could not parse, whichever ``Agent`` runs the model.

    Strands runs a call whose arguments it cannot read as a JSON object with ``{}`` (or with the
    list or string it did read), so a tool with optional arguments would run on made-up input.
    ``RLLMModel`` and ``NonStreamingOpenAIModel`` hand their unparseable calls to ``protect``,
    which registers this guard on the invoking agent (once per agent); the guard then cancels
    each such call before it runs, with an error naming the problem that the model reads as the
    tool result, and reports it to the agent's tool-error receiver (``StrandsAgent`` records it
    on the step). Under ``StrandsAgent`` the ``ToolCallValidator`` usually refuses them first.
    """

    def __init__(self) -> None:
        self._agents: weakref.WeakSet[Any] = weakref.WeakSet()

    def protect(self, invocation_state: dict[str, Any] | None, calls: list[ToolCall]) -> None:
        """Leave ``calls``' unparseable ones for this guard and make sure the invoking agent runs it."""
        if invocation_state is None or not any(call.error is not None for call in calls):
            return
        record_malformed_calls(invocation_state, calls)
        agent = invocation_state.get("agent")  # Strands puts the invoking agent here
        if agent is not None and agent not in self._agents:
            agent.hooks.add_hook(self)
            self._agents.add(agent)

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Check every tool call before it runs."""
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        tool_use_id = str(event.tool_use["toolUseId"])
        call = take_malformed_call(event.invocation_state, tool_use_id)
        if call is None or event.cancel_tool:
            return
        name = event.tool_use["name"]
        error = malformed_call_error(call, name)
        logger.debug("refused unparseable tool call %s: %s", tool_use_id, call.error)
        event.cancel_tool = error
        report_tool_error(event.invocation_state, tool_use_id, name, error)


class ToolCallValidator(HookProvider):
    """Refuses tool calls that Strands would otherwise run with made-up arguments.

    An unknown tool name, arguments that are not a JSON object (Strands substitutes ``{}``), or a
    missing required argument never reach the tool: the model gets a tool error naming the
    problem, and ``on_error`` is told so the step can record it.

    Args:
        lookup: Returns the model's raw ``ToolCall`` for a tool-use id, when the model recorded
            it; without it, unparseable arguments show up as missing arguments.
        on_error: Called with the tool-use id, the tool name and the error shown to the model.
    """

    def __init__(
        self,
        lookup: Callable[[str], ToolCall | None] | None = None,
        on_error: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self._lookup = lookup
        self._on_error = on_error

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Check every tool call before it runs."""
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        if event.cancel_tool:
            return
        error = self.check(event)
        if error is not None:
            event.cancel_tool = error
            if self._on_error is not None:
                self._on_error(str(event.tool_use["toolUseId"]), event.tool_use["name"], error)

    def check(self, event: BeforeToolCallEvent) -> str | None:
        """The error message for a malformed call, or ``None`` when it may run."""
        tool_use = event.tool_use
        name = tool_use["name"]
        call = self._lookup(str(tool_use["toolUseId"])) if self._lookup is not None else None
        if call is not None and call.error is not None:
            return malformed_call_error(call, name)
        if event.selected_tool is None:
            available = ", ".join(sorted(event.agent.tool_names)) or "none"
            return f"Error: unknown tool '{name}'. Available tools: {available}."
        arguments = tool_use["input"]
        if not isinstance(arguments, dict):
            return f"Error: invalid arguments for tool '{name}': arguments must be a JSON object."
        schema = event.selected_tool.tool_spec["inputSchema"].get("json", {})
        missing = [key for key in schema.get("required", []) if key not in arguments]
        if missing:
            return f"Error: tool '{name}' is missing required argument(s): {', '.join(missing)}."
        return None


class ToolFailureHook(HookProvider):
    """Types what a tool's exception means for the episode, from the exception itself.

    Strands turns an exception raised inside a tool into an error tool result (the model reads
    ``Error: <Type> - <message>``) and hands the exception object to ``AfterToolCallEvent``. This
    hook reads that object, never the text:

    * an ``InfrastructureError`` (e.g. ``ToolBackendError``) or one of ``infra_exceptions``: the
      tool's backend failed. The turn ends after the current tool round and ``reason`` is
      ``TOOL_BACKEND_ERROR``, an infrastructure failure (retried, masked, never scored).
    * a ``ConfigurationError`` (e.g. a backend rejecting its token): the turn ends after the
      round and ``fatal`` holds the error, which ``StrandsAgent`` raises at the end of the run.
    * anything else: the policy's doing (a bad argument); the model reads the error and goes on.

    The first failure wins; ``reset()`` clears it for a new episode.

    Args:
        infra_exceptions: Further exception classes that, raised by a tool, mean its backend
            failed (for tools you do not own that raise, say, ``httpx.TransportError``).
    """

    def __init__(self, infra_exceptions: tuple[type[BaseException], ...] = ()) -> None:
        self.infra_exceptions: tuple[type[BaseException], ...] = (InfrastructureError, *infra_exceptions)
        self.reset()

    def reset(self) -> None:
        """Forget the failure of the previous episode."""
        self.error: BaseException | None = None
        self.tool_name: str | None = None

    @property
    def reason(self) -> TerminationReason | None:
        """``TOOL_BACKEND_ERROR`` after a backend failure, else ``None``."""
        if self.error is not None and isinstance(self.error, self.infra_exceptions):
            return TerminationReason.TOOL_BACKEND_ERROR
        return None

    @property
    def fatal(self) -> ConfigurationError | None:
        """The configuration error a tool raised, which must stop the run."""
        return self.error if isinstance(self.error, ConfigurationError) else None

    @property
    def description(self) -> str:
        """``"tool 'name' failed: Type: message"``, or "" when no tool failed."""
        if self.error is None:
            return ""
        return f"tool '{self.tool_name}' failed: {type(self.error).__name__}: {self.error}"

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Watch every tool call and every tool round."""
        registry.add_callback(AfterToolCallEvent, self._after_tool_call)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def _after_tool_call(self, event: AfterToolCallEvent) -> None:
        error = event.exception
        if self.error is not None or error is None:
            return
        if isinstance(error, (*self.infra_exceptions, ConfigurationError)):
            self.error = error
            self.tool_name = event.tool_use["name"]
            log = logger.error if isinstance(error, ConfigurationError) else logger.warning
            log("%s", self.description)

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self.error is not None:
            # The episode is lost either way: spend no further generation on it.
            event.end_turn = f"Stopped: {self.description}"
