"""The one runner: what a rollout runs, from the agent factory's call (or the tools) to its ``FinishedRollout``.

Every door that runs an agent (``StrandsWorkflow`` in evaluation, the verl ``StrandsAgentLoop``, the
launcher's preflight and prompt measure, the local trainer) says what builds it in an ``AgentChoice``:
the user's ``agent_factory(model, task)``, or ``tools`` with a ``system_prompt`` from which rllm
builds a ``StrandsAgent``. ``build_rollout`` calls the factory (or builds the agent), records what it
built (``record_built``: an ``Agent``, or every node of a ``Swarm``/``Graph``) and checks it: an agent
or node on another model than the rollout's is refused, and one ``Agent`` on its own client is
allowed where the door serves one (``ClientRule``). ``BuiltRollout.run`` runs it: on its own client
through the door's ``OwnClient`` (``ThroughProxy`` in evaluation, ``ServedPolicy`` in training: a
session of the tracing proxy or of the trainer's ``PolicyServer``, read back by ``traced.py``), anything
else on the rollout's model (``run_built``). Nothing else in rllm calls an agent factory or
``build_agent`` (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from strands import Agent
from strands.handlers.callback_handler import PrintingCallbackHandler, null_callback_handler
from strands.models.model import Model

from rllm.engine.rollout.base import RolloutEngine
from rllm.engine.rollout.token_engine import TokenEngine
from rllm.errors import ConfigurationError
from rllm.integrations.strands.agent import StrandsAgent
from rllm.integrations.strands.hooks import Budget
from rllm.integrations.strands.model import RLLMModel
from rllm.integrations.strands.recorder import RolloutRecorder
from rllm.integrations.strands.rollout import Built, FinishedRollout, built_agents, invoke_agent, rollout_recorder
from rllm.integrations.strands.teams import record_built, run_built
from rllm.integrations.strands.traced import (
    TraceSource,
    answered_calls,
    read_served_rollout,
    read_traced_rollout,
)
from rllm.tracing.policy_server import PolicyServer
from rllm.tracing.session import session

__all__ = [
    "AgentChoice",
    "AgentFactory",
    "BuiltRollout",
    "ClientRule",
    "OwnClient",
    "ServedPolicy",
    "ThroughProxy",
    "build_agent",
    "build_rollout",
    "check_agent_choice",
    "refuse_other_models",
    "run_served_rollout",
    "run_traced_rollout",
    "silence_printing",
]

AgentFactory = Callable[[RLLMModel, dict[str, Any]], Built]
"""``agent_factory(model, task)``: what runs ``task``, built on ``model`` (the rollout's ``RLLMModel``)."""


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
    A door reaches it through ``build_rollout`` (an ``AgentChoice`` with ``tools``); tests and
    benchmarks may call it directly.
    """
    if not isinstance(model, Model):
        model = RLLMModel(model)
    return StrandsAgent(model, tools=tools, system_prompt=system_prompt, budget=budget, **agent_kwargs)


def check_agent_choice(
    where: str, *, agent_factory: object, tools: object, system_prompt: object = None,
    agent_kwargs: object = None, own_client: bool = False, trace_store: object = None,
    tools_key: str = "tools",
) -> None:
    """The one rule of what builds a rollout's agent, for every door that takes it.

    Exactly one of ``agent_factory`` (the user's agent) or ``tools`` (an agent rllm builds, with
    ``system_prompt``); ``system_prompt`` and ``agent_kwargs`` only with ``tools`` (a factory sets
    its agent's own); ``own_client`` and ``trace_store`` only with ``agent_factory`` (an agent on its
    own client). ``None`` (``False`` for ``own_client``) is "not given". ``where`` prefixes the
    message (``StrandsWorkflow``, ``rllm.agent_loop``, ...); ``tools_key`` is how that door spells
    ``tools`` (``tool_factory`` in a recipe). Raises ``ConfigurationError`` naming the argument and the fix.
    """
    factory = "agent_factory"
    if (agent_factory is None) == (tools is None):
        got = "neither" if agent_factory is None else "both"
        raise ConfigurationError(f"{where}: needs {factory} (your agent) or {tools_key} (its tools, with "
                                 f"system_prompt), exactly one; got {got}: set either {tools_key} or {factory}")
    if agent_factory is not None:
        for key, value in (("system_prompt", system_prompt), ("agent_kwargs", agent_kwargs)):
            if value is not None and value != {}:
                raise ConfigurationError(f"{where}: {key} does not apply with {factory}: the factory sets its "
                                         f"agent's system prompt and arguments; drop {key} or build the agent "
                                         f"from {tools_key}")
        return
    if own_client:
        raise ConfigurationError(f"{where}: own_client: true serves an {factory}'s agent on its own client; set "
                                 f"{factory} or drop own_client")
    if trace_store is not None:
        raise ConfigurationError(f"{where}: trace_store is for an {factory}'s agent on its own traced client; "
                                 f"the agent built from {tools_key} runs on the rollout's RLLMModel: drop trace_store "
                                 f"or pass {factory}")


def silence_printing(built: Built) -> int:
    """Give every agent that kept Strands' default ``PrintingCallbackHandler`` the null handler; how many.

    Strands' default prints every sampled token to stdout: in training, hundreds of rollouts at once
    would flood the log. A handler the user chose stays.
    """
    silenced = 0
    for agent in built_agents(built):
        if isinstance(agent.callback_handler, PrintingCallbackHandler):
            agent.callback_handler = null_callback_handler
            silenced += 1
    return silenced


def refuse_other_models(built: Built, model: Any, who: str, fix: str) -> None:
    """``ConfigurationError`` for an agent (or team node) built on a model other than ``model``.

    rllm records the calls of ``model`` only; ``who`` names what built the agent, ``fix`` says what to do.
    """
    for agent in built_agents(built):
        if agent.model is not model:
            kind = type(agent.model).__name__
            raise ConfigurationError(f"{who} built agent {agent.name!r} on another model ({kind}); {fix}")


class ClientRule(enum.Enum):
    """Where the agents a factory builds may send their model calls."""

    MODEL = "model"
    """Every agent and team node on the rollout's model (the default)."""
    MAY_OWN = "may_own"
    """Training's ``own_client``: one ``Agent`` may keep its own client (the door serves it the policy); an agent on
    the rollout's model runs there as under ``MODEL``."""
    TRACED = "traced"
    """Evaluation's ``trace_store``: one ``Agent`` on its own client through the tracing proxy, never on the
    rollout's model (whose calls would not reach the proxy's store)."""


_DEFAULT_FIX = "build it on the model it is given"


@dataclass(frozen=True)
class AgentChoice:
    """What builds a rollout's agent, as a door took it (``check_agent_choice`` is the rule a door applies first).

    Attributes:
        agent_factory: The user's ``agent_factory(model, task)`` (an ``Agent``, ``Swarm`` or ``Graph``); instead
            of ``tools``.
        tools: The Strands tools of the ``StrandsAgent`` rllm builds, with ``system_prompt``.
        system_prompt: That agent's system prompt (a factory sets its agent's own).
        budget: The episode's ``Budget``, for either (a team's nodes count one budget together).
        infra_exceptions: Exception classes that, raised by a tool, mark the rollout an infrastructure failure.
        name: The recorded trajectories' name (the built agent's, and a factory's lone agent's; a team's are its
            node ids); ``None``: the agent's own name.
        agent_kwargs: Further ``StrandsAgent`` arguments for the agent built from ``tools`` (hooks, ...).
        client: Where a factory's agent may send its calls (``ClientRule``).
        quiet: Silence Strands' default printing handler on what a factory built (training: hundreds of
            rollouts at once).
        who: What a refusal names as the factory (``rllm.agent_loop.agent_factory=my.module:agent``).
        fix: What a refusal of an agent on another model says to do.
    """

    agent_factory: AgentFactory | None = None
    tools: Sequence[Any] | None = None
    system_prompt: str | None = None
    budget: Budget | None = None
    infra_exceptions: tuple[type[BaseException], ...] = ()
    name: str | None = None
    agent_kwargs: Mapping[str, Any] = field(default_factory=dict)
    client: ClientRule = ClientRule.MODEL
    quiet: bool = False
    who: str = "agent_factory"
    fix: str = _DEFAULT_FIX


class OwnClient(Protocol):
    """Where the calls of an agent on its own model client go, and where its record is read back.

    One idea in evaluation (``ThroughProxy``: the LiteLLM proxy and its ``TraceStore``) and training
    (``ServedPolicy``: the trainer's ``PolicyServer``); ``BuiltRollout.run`` runs either the same way.
    """

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout: ...


@dataclass
class BuiltRollout:
    """What a rollout runs, built, recorded and checked (``build_rollout``).

    Attributes:
        built: The agent, or the team.
        recorders: Its recorders by name: one for an agent, one per node of a team.
        on_own_client: One ``Agent`` on its own client: it runs through the door's ``OwnClient``.
    """

    built: Built
    recorders: dict[str, RolloutRecorder]
    on_own_client: bool = False

    async def run(self, prompt: Any, *, own_client: OwnClient | None = None, timeout_s: float | None = None,
                  response_length: int | None = None) -> FinishedRollout:
        """Run it on ``prompt``: on its own client through ``own_client``, else on the rollout's model; its record.

        ``timeout_s`` bounds the run (past it: ``TIMEOUT``, infrastructure); ``response_length`` cuts the
        exported token fields (verl's ``rollout.response_length``).
        """
        if self.on_own_client:
            if own_client is None:
                raise ConfigurationError("an agent on its own client needs the door's OwnClient (ThroughProxy in "
                                         "evaluation, ServedPolicy in training) to run")
            (recorder,) = self.recorders.values()
            assert isinstance(self.built, Agent)
            return await own_client.run(self.built, prompt, recorder, timeout_s=timeout_s,
                                        response_length=response_length)
        return await run_built(self.built, prompt, self.recorders, timeout_s=timeout_s,
                               response_length=response_length)


def build_rollout(choice: AgentChoice, model: Model, task: dict[str, Any] | None = None, *,
                  where: str | None = None) -> BuiltRollout:
    """The rollout's agent or team for ``task`` on ``model``: built, recorded and checked.

    From ``tools``: a ``StrandsAgent`` (``build_agent``). From ``agent_factory``: its ``(model, task)``
    call; with ``where`` (the task, as the launcher names it), what the factory raises becomes a
    ``ConfigurationError`` naming ``choice.who`` and ``where`` (a ``ConfigurationError`` of its own is
    raised as it is); without, it is raised as it is. What it returns is recorded (``record_built``;
    not an ``Agent``, ``Swarm`` or ``Graph``: ``ConfigurationError``) and checked against
    ``choice.client``: an agent or node on another model is refused, naming ``choice.who`` and
    ``choice.fix``.
    """
    if choice.agent_factory is None:
        kwargs = {"infra_exceptions": choice.infra_exceptions, **({} if choice.name is None else {"name": choice.name}),
                  **choice.agent_kwargs}
        agent = build_agent(model, tools=list(choice.tools or []), system_prompt=choice.system_prompt,
                            budget=choice.budget, **kwargs)
        return BuiltRollout(agent, {agent.name: agent.recorder})
    built = _call_factory(choice, model, dict(task or {}), where)
    try:
        recorders = record_built(built, name=choice.name, budget=choice.budget,
                                 infra_exceptions=choice.infra_exceptions)
    except TypeError as error:  # not an Agent, Swarm or Graph, or a team with a node rllm cannot record
        raise ConfigurationError(f"{choice.who}: {error}") from error
    if choice.quiet:
        silence_printing(built)
    return BuiltRollout(built, recorders, on_own_client=_on_own_client(built, model, choice))


def _call_factory(choice: AgentChoice, model: Model, task: dict[str, Any], where: str | None) -> Built:
    assert choice.agent_factory is not None
    if where is None:
        return choice.agent_factory(model, task)  # type: ignore[arg-type]  # a door's model is an RLLMModel
    try:
        return choice.agent_factory(model, task)  # type: ignore[arg-type]
    except ConfigurationError:
        raise
    except Exception as error:
        raise ConfigurationError(f"{choice.who} raised on {where} ({type(error).__name__}: {error})") from error


def _on_own_client(built: Built, model: Model, choice: AgentChoice) -> bool:
    """Whether ``built`` runs on its own client; ``ConfigurationError`` for what ``choice.client`` does not allow."""
    if choice.client is ClientRule.TRACED:
        if not isinstance(built, Agent):
            raise ConfigurationError(f"{choice.who} returns one Strands Agent, not a {type(built).__name__}")
        if built.model is model:
            raise ConfigurationError(f"{choice.who} builds the agent on its own traced client "
                                     "(rllm.tracing.get_chat_client_async), not on the model it is given, whose calls "
                                     "do not go through the proxy")
        return True
    if choice.client is ClientRule.MAY_OWN and isinstance(built, Agent) and built.model is not model:
        return True
    fix = choice.fix if choice.client is ClientRule.MODEL else (
        "build every node on the model it is given (an own client serves one Agent, not a team's nodes)")
    refuse_other_models(built, model, choice.who, fix)
    return False


# ---------------------------------------------------------------- an agent on its own client
async def run_traced_rollout(
    agent: Agent, prompt: Any, store: TraceSource, *, recorder: RolloutRecorder | None = None,
    timeout_s: float | None = None, response_length: int | None = None, wait_s: float = 30.0,
    session_id: str | None = None,
) -> FinishedRollout:
    """``run_rollout`` for an agent whose model calls go through the tracing proxy that writes ``store``.

    The run gets a fresh session (``session_id``, random by default); afterwards its traces are read
    from ``store``, waiting up to ``wait_s`` for calls the proxy logs after answering
    (``traced.read_traced_rollout``: one trajectory per token sequence; no stored call is a
    ``ConfigurationError``, some missing a ``StoreWriteError``, a cut call ``GenerationAbortedError``).
    ``recorder``, ``timeout_s`` and ``response_length`` are ``run_rollout``'s.
    """
    recorder = rollout_recorder(agent, recorder, "run_traced_rollout")
    before = answered_calls(recorder)
    async with session(session_id=session_id) as ctx:
        ran = await invoke_agent(agent, prompt, recorder, timeout_s)
    return await read_traced_rollout(agent, recorder, ran, store, ctx.id, answered_calls(recorder) - before,
                                     wait_s=wait_s, response_length=response_length)


async def run_served_rollout(
    agent: Agent, prompt: Any, server: PolicyServer, engine: TokenEngine, *, recorder: RolloutRecorder | None = None,
    params: dict[str, Any] | None = None, timeout_s: float | None = None, response_length: int | None = None,
) -> FinishedRollout:
    """``run_traced_rollout`` for an agent whose own client calls ``server`` (training): its record.

    The rollout opens a session on ``server`` served by ``engine`` (``params``: sampling under every
    call's own; the sampling keys the client sends are ignored, ``PolicyServer``); its record is read
    from the server's traces, as from the proxy's store, and checked against the engine's samples
    token for token (``traced.read_served_rollout``: a run that raised because of a failed call ends
    on what the engine raised for that very call).
    """
    recorder = rollout_recorder(agent, recorder, "run_served_rollout")
    session_id = f"rollout-{uuid.uuid4().hex}"
    with server.open(session_id, engine, params) as served:
        finished = await run_traced_rollout(agent, prompt, server, recorder=recorder, timeout_s=timeout_s,
                                            response_length=response_length, wait_s=0.0, session_id=session_id)
    return read_served_rollout(finished, served, recorder, session_id)


@dataclass(frozen=True)
class ThroughProxy:
    """Evaluation: the agent's client calls the tracing proxy that writes ``store`` (``run_traced_rollout``)."""

    store: TraceSource
    wait_s: float = 30.0

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout:
        return await run_traced_rollout(agent, prompt, self.store, recorder=recorder, timeout_s=timeout_s,
                                        response_length=response_length, wait_s=self.wait_s)


@dataclass(frozen=True)
class ServedPolicy:
    """Training: the agent's client calls the trainer's ``server``, answered by ``engine`` (``run_served_rollout``)."""

    server: PolicyServer
    engine: TokenEngine
    params: dict[str, Any] | None = None

    async def run(self, agent: Agent, prompt: Any, recorder: RolloutRecorder, *, timeout_s: float | None,
                  response_length: int | None) -> FinishedRollout:
        return await run_served_rollout(agent, prompt, self.server, self.engine, recorder=recorder,
                                        params=self.params, timeout_s=timeout_s, response_length=response_length)
