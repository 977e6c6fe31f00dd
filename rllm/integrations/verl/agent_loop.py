"""``StrandsAgentLoop``: a verl agent loop that runs an unchanged Strands agent on exact tokens.

verl (0.9.1) builds one agent loop per trajectory from the YAML list named by
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` and calls ``run(sampling_params,
**row)``. This loop builds a ``StrandsAgent`` over ``RLLMModel(VerlEngine(server_manager))`` for
the row, runs it with ``invoke_async`` and returns the rollout's ``TokenTrace`` as an
``AgentLoopOutput``: ``prompt_ids`` is the first rendered prompt, ``response_ids`` everything after
it (sampled and tool tokens, capped at ``rollout.response_length``), ``response_mask`` 1 exactly on
sampled tokens and ``response_logprobs`` their sampling logprobs (0.0 elsewhere). verl groups the
``rollout.n`` rollouts of a row by ``uid`` for RLOO, scores them with the custom reward function
(``rllm.integrations.verl.reward``, which reads the final answer from ``extra_fields``) and trains.

Only typed infrastructure failures are excluded from the update: the rollout server unreachable,
failing, throttled or aborting the generation (``rllm.errors.InfrastructureError`` from the
engine), a tool's backend marking its own failure (a tool raising an ``InfrastructureError`` such
as ``ToolBackendError``, or one of ``infra_exceptions``), or the rollout running past
``timeout_s``. In verl's v1 trainer (the default) ``run`` then returns an empty list, which verl's
TransferQueue worker stores as "no trajectory for this session": the rollout carries no tokens,
gets no reward and takes no part in its group's RLOO baseline (``compute_rloo_outcome_advantage``
groups whatever rows share a ``uid``). The legacy v0 trainer cannot drop a row, so there it is
returned with an all-zero ``response_mask`` (no gradient), flagged ``infra_failure``, and the
reward function scores it 0 (which still enters its group's baseline: use v1).

Anything else (a template error, a ``TypeError``, an unknown tool factory, a tool backend
refusing its credentials with a ``ConfigurationError``) raises out of ``run`` with its cause:
such an error would end every rollout the same way, so it must fail the step, not be trained
around. ``rllm.integrations.verl.manager.StrandsAgentLoopManager`` makes verl's v1 trainer fail
on it (verl's own worker only logs a session's exception) and stops a step whose rollouts are
mostly dropped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from rllm.engine.rollout.verl_engine import VerlEngine, VerlSession
from rllm.integrations.strands import Budget, StrandsAgent, describe_failure
from rllm.integrations.strands.rollout import build_agent, read_rollout, rollout_termination
from rllm.integrations.verl._dotted import import_object
from rllm.types import TerminationReason

logger = logging.getLogger(__name__)

DEFAULT_TOOL_FACTORY = "rllm.agents.search:search_tools"
DEFAULT_INFRA_EXCEPTIONS: tuple[str, ...] = ()
"""Exception classes that, raised by a tool, mean its backend failed, besides ``InfrastructureError``.

Empty: tools mark their own backend failures by raising ``rllm.errors.ToolBackendError`` (as
``local_search`` does). Name a third-party tool's exception here (``httpx.TransportError``) only
when it can never be the policy's doing.
"""
OUTCOME_KWARG = "rllm_outcome"
"""The keyword under which a worker may pass ``run`` a ``RolloutOutcome`` to fill in."""


@dataclass
class RolloutOutcome:
    """What became of one rollout, for whoever counts a step's rollouts (verl hands ``run`` no other channel).

    Attributes:
        dropped: The rollout was excluded from the update as an infrastructure failure.
        cause: Why, as ``"ExceptionType: message"`` or a termination reason.
        error: The non-infrastructure error that ``run`` raised, as ``"ExceptionType: message"``.
    """

    dropped: bool = False
    cause: str = ""
    error: str = ""


@functools.lru_cache(maxsize=16)
def _cached_tools(factory: str, kwargs_json: str) -> tuple[Any, ...]:
    # Strands tools are stateless callables, so one set per worker process serves every rollout
    # (and keeps one connection pool per tool instead of one per trajectory).
    return tuple(import_object(factory)(**json.loads(kwargs_json)))


def build_tools(factory: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
    """The Strands tools ``factory(**kwargs)`` returns, built once per process for equal arguments."""
    return list(_cached_tools(factory, json.dumps(kwargs or {}, sort_keys=True)))


def _plain(value: Any) -> Any:
    """Plain Python containers for OmegaConf / numpy values handed over by verl."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return value.tolist()
    return value


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def split_prompt(raw_prompt: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The row's system prompt (if its first message is one) and the rest as Strands messages."""
    messages = [dict(m) for m in _plain(raw_prompt)]
    if not messages:
        raise ValueError("the row's prompt has no messages")
    system = None
    if messages[0].get("role") == "system":
        system = _text_of(messages.pop(0).get("content"))
    if not messages:
        raise ValueError("the row's prompt has a system message but no user message")
    return system, [{"role": m["role"], "content": [{"text": _text_of(m.get("content"))}]} for m in messages]


class StrandsAgentLoop(AgentLoopBase):
    """Runs a Strands agent per trajectory inside verl and returns its exact token trace.

    Keyword arguments come from the agent-loop YAML entry (next to ``name`` and ``_target_``);
    the rest (``trainer_config``, ``server_manager``, ``tokenizer``, ...) from verl's worker.

    Args:
        tool_factory: ``module:function`` returning the agent's Strands tools.
        tool_kwargs: Keyword arguments for ``tool_factory`` (e.g. ``retrieval_url``).
        system_prompt: Used when the row's prompt has no system message (a row without one and a
            ``None`` here is refused).
        max_model_turns, max_tool_iterations, max_tool_calls: The episode ``Budget``.
        tool_parser: How tool calls are parsed from sampled text (``hermes`` for Qwen3).
        timeout_s: Wall-clock limit per rollout; a rollout that runs past it is an infrastructure
            failure (a hung tool or server), excluded from the update. ``None``: no limit.
        infra_exceptions: Dotted names of further exception classes that, raised by a tool, mark
            the rollout as an infrastructure failure (``rllm.errors.InfrastructureError`` always does).
        tools: verl's own tool list (``rollout.multi_turn.tool_config_path``); must be empty,
            since this loop runs Strands tools.
    """

    def __init__(
        self,
        *args: Any,
        tool_factory: str = DEFAULT_TOOL_FACTORY,
        tool_kwargs: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        max_model_turns: int | None = None,
        max_tool_iterations: int | None = None,
        max_tool_calls: int | None = None,
        tool_parser: str = "hermes",
        timeout_s: float | None = None,
        infra_exceptions: Sequence[str] = DEFAULT_INFRA_EXCEPTIONS,
        tools: Any = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if tools is not None and getattr(tools, "tools", None):
            raise ValueError(
                "StrandsAgentLoop runs the Strands tools of tool_factory; unset "
                "actor_rollout_ref.rollout.multi_turn.tool_config_path / function_tool_path"
            )
        self.name = name or "strands_agent"
        self.tool_factory = tool_factory
        self.tool_kwargs = dict(_plain(tool_kwargs) or {})
        self.system_prompt = system_prompt
        self.budget = Budget(max_model_turns=max_model_turns, max_tool_iterations=max_tool_iterations,
                             max_tool_calls=max_tool_calls)
        self.tool_parser = tool_parser
        self.timeout_s = timeout_s
        self.infra_exceptions = tuple(import_object(path) for path in _plain(infra_exceptions) or ())
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.context_length = int(self.rollout_config.get("max_model_len") or self.prompt_length + self.response_length)
        self.use_v1 = bool(OmegaConf.select(self.config, "trainer.use_v1", default=True))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run one rollout of the row; an infrastructure failure yields no trajectory (v1), any other error raises.

        A ``RolloutOutcome`` passed as ``rllm_outcome`` (by ``StrandsAgentLoopWorker``) is filled
        in with what became of the rollout.
        """
        outcome = kwargs.pop(OUTCOME_KWARG, None)
        try:
            output = await self.rollout(sampling_params, **kwargs)
        except Exception as error:
            if isinstance(outcome, RolloutOutcome):
                outcome.error = describe_failure(error)
            raise
        extra = output.extra_fields
        if extra["infra_failure"]:
            logger.warning("rollout excluded from the update (%s): %s", extra["termination_reason"],
                           extra["infra_error"])
            if isinstance(outcome, RolloutOutcome):
                outcome.dropped, outcome.cause = True, extra["infra_error"]
            if self.use_v1:
                return []
        return output

    def _system_prompt(self, from_row: str | None) -> str:
        if from_row is not None:
            return from_row
        if self.system_prompt is not None:
            return self.system_prompt
        raise ValueError("the row's prompt has no system message and the agent loop's system_prompt is null; "
                         "write it into the rows (scripts/prepare_hotpotqa.py does) or set system_prompt")

    def build_engine(self, sampling_params: dict[str, Any]) -> VerlEngine:
        """The rollout's token engine over verl's server client, with verl's lengths and sampling."""
        return VerlEngine(
            self.server_manager,
            self.tokenizer,
            response_length=self.response_length,
            prompt_length=self.prompt_length,
            server_sampling=sampling_params,
            tool_parser=self.tool_parser,
            context_length=self.context_length,
            chat_template_kwargs=_plain(self.apply_chat_template_kwargs) or {},
        )

    async def rollout(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the agent on the row and return its output, infrastructure failures included (flagged).

        Raises any exception that is not a typed infrastructure failure or a policy outcome
        (context overflow, response budget), with its cause. The agent is built and its end read
        as in evaluation (``rllm.integrations.strands.rollout``); the tokens are its
        ``trajectory.token_trace``, exported with ``TokenTrace.to_verl`` at ``response_length``.
        """
        system, conversation = split_prompt(kwargs["raw_prompt"])
        agent = build_agent(
            self.build_engine(sampling_params),
            tools=build_tools(self.tool_factory, self.tool_kwargs),
            system_prompt=self._system_prompt(system),
            budget=self.budget,
            name=self.name,
            infra_exceptions=self.infra_exceptions,
        )
        prompt: Any = conversation
        if len(conversation) == 1 and conversation[0]["role"] == "user":
            prompt = conversation[0]["content"][0]["text"]
        error: BaseException | None = None
        try:
            if self.timeout_s is None:
                await agent.invoke_async(prompt)
            else:
                await asyncio.wait_for(agent.invoke_async(prompt), timeout=self.timeout_s)
        except Exception as caught:  # noqa: BLE001 - typed below; anything untyped is raised
            if rollout_termination(agent, caught) is TerminationReason.ERROR:
                logger.error("rollout failed with %s: %s; not an infrastructure failure, so it is raised",
                             type(caught).__name__, caught)
                raise
            error = caught
        if agent.trajectory.token_trace is None:
            raise RuntimeError(f"the agent stopped before its first model call: {error!r}") from error
        return self._output(agent, error, kwargs)

    def _output(self, agent: StrandsAgent, error: BaseException | None, row: dict[str, Any]) -> AgentLoopOutput:
        end = read_rollout(agent, error)
        infra_error = end.failure if end.infra_failure else ""
        trace = agent.trajectory.token_trace
        assert trace is not None
        fields = trace.to_verl(self.response_length)
        if infra_error:
            fields["response_mask"] = [0] * len(fields["response_ids"])
        trajectory = agent.trajectory
        extra: dict[str, Any] = {
            "final_answer": end.final_answer,
            "termination_reason": end.reason.value,
            "infra_failure": bool(infra_error),
            "infra_error": infra_error,
            "num_model_calls": trace.num_turns,
            "num_tool_calls": sum(len(step.tool_calls) for step in trajectory.steps),
            "num_tool_errors": trajectory.num_tool_errors,
            "response_truncated": len(trace) - trace.prompt_length > self.response_length,
        }
        session = agent.token_session
        stats = session if isinstance(session, VerlSession) else VerlSession()
        low = stats.min_global_steps if stats.min_global_steps is not None else row.get("global_steps")
        high = stats.max_global_steps if stats.max_global_steps is not None else low
        if low is not None:
            extra.update(min_global_steps=int(low), max_global_steps=int(high))
        tool_seconds = sum(m.total_time for m in agent.event_loop_metrics.tool_metrics.values())
        return AgentLoopOutput(
            **fields,
            metrics=AgentLoopMetrics(generate_sequences=stats.generate_seconds, tool_calls=tool_seconds,
                                     num_preempted=stats.num_preempted),
            extra_fields=extra,
        )
