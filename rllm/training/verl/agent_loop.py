"""``StrandsAgentLoop``: a verl agent loop that runs an unchanged Strands agent on exact tokens.

verl builds one loop per trajectory from the registry ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
names and calls ``run(sampling_params, **row)``; the loop reads its settings from the recipe alone
(``rllm.training.verl.settings.loop_settings``: ``rllm.agent_loop``, ``rllm.reward_fn``, verl's ``multi_turn``
keys). It builds the
row's agent (from ``tool_factory``, or the user's ``agent_factory`` given the row's task) over
``RLLMModel(VerlEngine(server_manager))``, runs it as evaluation does (``rllm.integrations.strands.runner``), scores it
with ``rllm.reward_fn`` when set (the score handed to verl on the outputs' ``reward_score``,
``reward.hand_to_verl``), and returns one ``AgentLoopOutput`` per sample of the rollout, each from
its ``TokenTrace`` (``response_mask`` 1 exactly on sampled tokens). A typed infrastructure failure or a
cancelled run returns no sample (verl drops the rollout from the update); any other error raises with its
cause, and ``StrandsAgentLoopManager`` fails the step on it. Why, and how verl groups and scores the
samples: ARCHITECTURE.md, "Training" and "Credit".
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from rllm.data.verl_rows import row_task
from rllm.engine.rollout.verl_engine import VerlEngine, VerlSession
from rllm.errors import ConfigurationError
from rllm.integrations.strands import RLLMModel, describe_failure
from rllm.integrations.strands.rollout import Built, FinishedRollout, built_agents
from rllm.integrations.strands.runner import AgentChoice, BuiltRollout, ClientRule, ServedPolicy, build_rollout
from rllm.records import CONVERSATION_FIELD, conversation, number_call_ids
from rllm.rewards.base import score_answer
from rllm.tokens.renderer import content_text
from rllm.tracing.policy_server import PolicyServer
from rllm.training.verl._dotted import import_object
from rllm.training.verl.reward import hand_to_verl
from rllm.training.verl.secrets import receive_secrets
from rllm.training.verl.settings import (
    AGENT_LOOP_KEYS,
    MULTI_TURN_KEY,
    SETTINGS_KEY,
    LoopSettings,
    loop_settings,
    read_settings,
)
from rllm.types import TerminationReason

logger = logging.getLogger(__name__)

OUTCOME_KWARG = "rllm_outcome"
"""The keyword under which a worker may pass ``run`` a ``RolloutOutcome`` to fill in."""
POLICY_SERVER_KWARG = "rllm_policy_server"
"""The keyword under which a worker passes ``run`` its ``PolicyServer`` (started by the first rollout that needs it)."""


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
def _cached_tools(tool_factory: str, kwargs_json: str) -> tuple[Any, ...]:
    # Strands tools are stateless callables, so one set per worker process serves every rollout
    # (and keeps one connection pool per tool instead of one per trajectory).
    return tuple(import_object(tool_factory)(**json.loads(kwargs_json)))


def build_tools(tool_factory: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
    """The Strands tools ``tool_factory(**kwargs)`` returns, built once per process for equal arguments.

    The run's secrets (the retrieval token) are copied into this worker's environment first, where
    the tools read them (``rllm.training.verl.secrets``).
    """
    receive_secrets()
    return list(_cached_tools(tool_factory, json.dumps(kwargs or {}, sort_keys=True)))


def _plain(value: Any) -> Any:
    """Plain Python containers for OmegaConf / numpy values handed over by verl."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return value.tolist()
    return value


def agent_choice(settings: LoopSettings, *, system_prompt: str | None = None, name: str | None = None) -> AgentChoice:
    """What builds a rollout's agent in training, as every rollout worker (and the launcher's checks) builds it.

    The recipe's ``agent_factory`` (imported here; ``ImportError`` when it does not import), else an agent from
    ``tool_factory``'s tools with ``system_prompt``; the budget and ``infra_exceptions`` for either; ``own_client``
    lets a factory's one ``Agent`` keep its own client. A refusal names the recipe's key.
    """
    block = settings.block
    common: dict[str, Any] = {
        "budget": settings.budget, "infra_exceptions": settings.infra_exceptions, "name": name, "quiet": True,
        "who": f"{SETTINGS_KEY}.agent_factory={block.agent_factory}",
        "fix": "build it on the model it is given, whose token engine records what training needs, or, for an "
               f"agent on its own OpenAI client, set {SETTINGS_KEY}.own_client: true"}
    if block.agent_factory is not None:
        return AgentChoice(agent_factory=import_object(block.agent_factory),
                           client=ClientRule.MAY_OWN if block.own_client else ClientRule.MODEL, **common)
    assert block.tool_factory is not None
    return AgentChoice(tools=build_tools(block.tool_factory, block.tool_kwargs), system_prompt=system_prompt, **common)


def row_task_or_row(row: dict[str, Any]) -> dict[str, Any]:
    """What the factory and the reward get: the user's task a row of ``task_rows`` holds, else the row itself."""
    plain = {key: _plain(value) for key, value in row.items()}
    task = row_task(plain)
    return plain if task is None else task


def _record_task(row: dict[str, Any]) -> Any:
    """The task a rollout record shows: the user's task a row of ``task_rows`` holds, else the row's prompt."""
    task = row_task({key: _plain(value) for key, value in row.items() if key in ("extra_info", "raw_prompt")})
    return task if task is not None else {"raw_prompt": _plain(row.get("raw_prompt"))}


def task_key(raw_prompt: Any) -> str:
    """A key of the row's own prompt: every rollout of one verl group shares it, whatever prompt a factory builds."""
    text = json.dumps(_plain(raw_prompt), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_TEAM_TOOLS = frozenset({"handoff_to_agent"})
"""Tools a Strands ``Swarm`` gives its nodes: the team's plumbing, not the user's tools."""


def count_tools(built: Built) -> int:
    """The distinct tools of the agent, or of a team's agents together (a Swarm's handoff tool left out)."""
    return len({name for agent in built_agents(built) for name in agent.tool_names} - _TEAM_TOOLS)


_COUNTED = ("malformed_tool_calls", "side_calls", "discarded_answers", "rewritten_calls")
"""``FinishedRollout.metrics`` counts the loop reports as ``num_<name>`` for the guards."""


def split_prompt(raw_prompt: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The row's system prompt (if its first message is one) and the rest as Strands messages."""
    messages = [dict(m) for m in _plain(raw_prompt)]
    if not messages:
        raise ConfigurationError("the row's prompt has no messages")
    system = None
    if messages[0].get("role") == "system":
        system = content_text(messages.pop(0).get("content"))
    if not messages:
        raise ConfigurationError("the row's prompt has a system message but no user message")
    return system, [{"role": m["role"], "content": [{"text": content_text(m.get("content"))}]} for m in messages]


def agent_prompt(conversation: list[dict[str, Any]]) -> Any:
    """What the agent is invoked with: a lone user message as its text, else the messages (``split_prompt``'s)."""
    if len(conversation) == 1 and conversation[0]["role"] == "user":
        return conversation[0]["content"][0]["text"]
    return conversation


def tool_agent_instructions(settings: LoopSettings, from_row: str | None, where: str = "the row") -> str:
    """The system prompt of the agent built from ``tool_factory``: the row's system message, else the block's.

    ``ConfigurationError`` naming ``where`` when it has neither: the agent would have no instructions.
    """
    if from_row is not None:
        return from_row
    if settings.block.system_prompt is not None:
        return settings.block.system_prompt
    raise ConfigurationError(f"{where}'s prompt has no system message and {SETTINGS_KEY}.system_prompt is null: the "
                             "agent built from tool_factory would have no instructions; write it into the rows "
                             f"(scripts/prepare_hotpotqa.py does) or set {SETTINGS_KEY}.system_prompt")


class StrandsAgentLoop(AgentLoopBase):
    """Runs a Strands agent per trajectory inside verl and returns its exact token trace.

    verl's worker passes ``trainer_config``, ``server_manager``, ``tokenizer``, ... and the
    agent-loop YAML entry's ``name``; the loop's own settings come from that trainer config
    (``loop_settings``), never from the YAML entry, which may only name the class.

    Args:
        tools: verl's own tool list (``rollout.multi_turn.tool_config_path``); must be empty,
            since this loop runs Strands tools.
        name: The entry's name; names the recorded trajectory.
    """

    def __init__(self, *args: Any, tools: Any = None, name: str | None = None, **kwargs: Any) -> None:
        misplaced = sorted(set(kwargs) & {*AGENT_LOOP_KEYS, "max_model_turns", "max_tool_iterations", "max_tool_calls",
                                          "tool_parser"})
        if misplaced:
            raise ConfigurationError(f"StrandsAgentLoop got {misplaced} from its agent-loop YAML entry; its settings "
                                     f"come from the recipe alone: set them under {SETTINGS_KEY} (the tool parser "
                                     f"is {MULTI_TURN_KEY}.format)")
        super().__init__(*args, **kwargs)
        if tools is not None and getattr(tools, "tools", None):
            raise ConfigurationError(
                "StrandsAgentLoop runs the Strands tools of tool_factory; unset "
                "actor_rollout_ref.rollout.multi_turn.tool_config_path / function_tool_path"
            )
        self.settings = loop_settings(self.config)
        self.records = read_settings(self.config).rollout_records
        self.name = name or "strands_agent"
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.context_length = int(self.rollout_config.get("max_model_len") or self.prompt_length + self.response_length)

    async def run(  # type: ignore[override]  # verl's v1 worker takes a list: one row per sample, none dropped
        self, sampling_params: dict[str, Any], **kwargs: Any,
    ) -> list[AgentLoopOutput]:
        """Run one rollout of the row: its samples; an infrastructure failure or a cancelled run yields none.

        Any other error raises.

        A ``RolloutOutcome`` passed as ``rllm_outcome`` (by ``StrandsAgentLoopWorker``) is filled
        in with what became of the rollout.
        """
        outcome = kwargs.pop(OUTCOME_KWARG, None)
        server = kwargs.pop(POLICY_SERVER_KWARG, None)
        try:
            outputs = await self.rollout(sampling_params, policy_server=server, **kwargs)
        except Exception as error:
            if isinstance(outcome, RolloutOutcome):
                outcome.error = describe_failure(error)
            raise
        extra = outputs[-1].extra_fields
        if not TerminationReason(extra["termination_reason"]).is_scored:  # infrastructure, or cancelled
            cause = extra["infra_error"] or extra["termination_reason"]
            logger.warning("rollout excluded from the update (%s): %s", extra["termination_reason"], cause)
            if isinstance(outcome, RolloutOutcome):
                outcome.dropped, outcome.cause = True, cause
            return []
        return outputs

    def build_engine(self, sampling_params: dict[str, Any]) -> VerlEngine:
        """The rollout's token engine over verl's server client, with verl's lengths and sampling."""
        return VerlEngine(
            self.server_manager,
            self.tokenizer,
            response_length=self.response_length,
            prompt_length=self.prompt_length,
            server_sampling=sampling_params,
            tool_parser=self.settings.tool_parser,
            context_length=self.context_length,
            chat_template_kwargs=_plain(self.apply_chat_template_kwargs) or {},
        )

    async def rollout(self, sampling_params: dict[str, Any], *, policy_server: PolicyServer | None = None,
                      **kwargs: Any) -> list[AgentLoopOutput]:
        """Run the agent on the row and return one output per sample, infrastructure failures included (flagged).

        Raises any exception that is not a typed infrastructure failure or a policy outcome
        (context overflow, response budget), with its cause. The agent is built and run as in
        evaluation (``build_rollout``, ``BuiltRollout.run``); the tokens are its samples
        (``FinishedRollout.samples``), exported with ``TokenTrace.to_verl`` at ``response_length``. With
        ``own_client`` the agent's own client calls ``policy_server`` (the worker's), whose answers are
        the same engine's (``run_served_rollout``).
        """
        system, conversation = split_prompt(kwargs["raw_prompt"])
        max_tokens = self.settings.block.max_tokens_per_turn
        params = {} if max_tokens is None else {"max_tokens": max_tokens}
        engine = self.build_engine(sampling_params)
        model = RLLMModel(engine, params=params)
        if self.settings.block.own_client:
            if policy_server is None:
                raise ConfigurationError(f"{SETTINGS_KEY}.own_client needs rllm's agent-loop worker, which serves the "
                                         "policy (rllm.training.verl.manager.StrandsAgentLoopManager)")
            (await policy_server.start()).export()  # before the factory, which reads RLLM_POLICY_*
        rollout = self._agent(model, system, kwargs)
        own_client = None if policy_server is None or not self.settings.block.own_client else \
            ServedPolicy(policy_server, engine, params)
        finished = await rollout.run(agent_prompt(conversation), own_client=own_client,
                                     timeout_s=self.settings.block.timeout_s,
                                     response_length=self.response_length)
        finished.raise_if_unexpected()
        outputs = self._outputs(finished, kwargs, num_tools=count_tools(rollout.built))
        if self.settings.reward_fn is not None and finished.end.scored:
            reward = await score_answer(import_object(self.settings.reward_fn), row_task_or_row(kwargs),
                                        finished.end.final_answer)
            hand_to_verl(outputs, reward, tool_calls=int(finished.metrics["tool_calls"]))
        return outputs

    def _agent(self, model: RLLMModel, system: str | None, row: dict[str, Any]) -> BuiltRollout:
        """The rollout's agent (or team) and its recorders: from ``tool_factory``, or the user's ``agent_factory``.

        A factory's agent is built on ``model`` (the row's task, ``row_task_or_row``), or with ``own_client``
        it may be one ``Agent`` on its own client; the runner refuses anything else before it runs.
        """
        if self.settings.block.agent_factory is None:
            return build_rollout(agent_choice(self.settings, name=self.name,
                                              system_prompt=tool_agent_instructions(self.settings, system)), model)
        receive_secrets()
        return build_rollout(agent_choice(self.settings, name=self.name), model, row_task_or_row(row))

    def _outputs(self, finished: FinishedRollout, row: dict[str, Any], *,
                 num_tools: int | None = None) -> list[AgentLoopOutput]:
        """One ``AgentLoopOutput`` per sample of a finished rollout, as sampled (``run`` drops one not ``scored``).

        Every sample carries the rollout's ``extra_fields`` (the last one is scored) plus its
        ``sample_index``, the node (``agent``) whose sample it is, and the rollout's ``num_samples``;
        the guards read the row's ``task_prompt``, ``num_tools`` and the rollout's counts from them.
        """
        end = finished.end
        infra_error = end.failure if end.infra_failure else ""
        samples = finished.token_samples()
        extra: dict[str, Any] = {
            "final_answer": end.final_answer,
            "termination_reason": end.reason.value,
            "infra_failure": bool(infra_error),
            "infra_error": infra_error,
            "num_model_calls": finished.num_model_calls,
            "num_tool_calls": int(finished.metrics["tool_calls"]),
            "num_tool_errors": int(finished.metrics["tool_errors"]),
            "response_truncated": finished.truncated,
            "num_samples": len(samples),
            "task_prompt": task_key(row.get("raw_prompt")),
            "num_tools": -1 if num_tools is None else int(num_tools),
            **{f"num_{name}": int(finished.metrics.get(name, 0.0)) for name in _COUNTED},
        }
        sessions = [s for s in finished.token_sessions if isinstance(s, VerlSession)]
        lows = [s.min_global_steps for s in sessions if s.min_global_steps is not None]
        highs = [s.max_global_steps for s in sessions if s.max_global_steps is not None]
        low = min(lows) if lows else row.get("global_steps")
        high = max(highs) if highs else low
        if low is not None:
            extra.update(min_global_steps=int(low), max_global_steps=int(high if high is not None else low))
        record = ""
        if self.records.every_n_steps is not None:  # the rollout's record (rllm.training.verl.trainer.rollout_records)
            conversations = [conversation(t.steps) for t in finished.trajectories]
            number_call_ids(conversations)
            threads = [{"name": t.name, "conversation": c} for t, c in zip(finished.trajectories, conversations,
                                                                          strict=True)]
            record = json.dumps({"task": _record_task(row), "trajectories": threads}, default=str)
        metrics = AgentLoopMetrics(generate_sequences=finished.generation_seconds, tool_calls=finished.tool_seconds,
                                   num_preempted=finished.num_preempted)
        return [AgentLoopOutput(**sample, metrics=metrics, extra_fields={
                    **extra, "sample_index": index, "agent": finished.sample_names[index],
                    CONVERSATION_FIELD: record if index == len(samples) - 1 else ""})
                for index, sample in enumerate(samples)]

