"""The one runner (``build_rollout``, ``BuiltRollout.run``): what every door's factory built, from call to record.

What a door relies on, over a scripted token policy on Qwen3's shipped template: an agent from tools
and a factory's agent run to the same record; what a factory returns that rllm cannot record, or an
agent on a model the door does not record, is a ``ConfigurationError`` naming the door's factory
before anything runs; a factory's own error is raised as it is in a rollout and named with the task
before a run (the launcher's checks); an agent on its own client needs the door's ``OwnClient``.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent, tool
from strands.handlers.callback_handler import PrintingCallbackHandler
from strands.models.openai import OpenAIModel

from rllm.errors import ConfigurationError
from rllm.integrations.strands import RLLMModel
from rllm.integrations.strands.runner import AgentChoice, ClientRule, build_rollout
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.types import TerminationReason

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key} holds 7"


def _model(tokenizer: Any) -> RLLMModel:
    """A policy that looks alpha up, then answers."""
    return RLLMModel(ScriptedTokenEngine(tokenizer, lambda prompt: "\\boxed{7}" if "<tool_response>" in prompt
                                         else CALL))


def _elsewhere() -> OpenAIModel:
    return OpenAIModel(client_args={"api_key": "unused", "base_url": "http://127.0.0.1:9/v1"}, model_id="other")


async def test_an_agent_from_tools_and_a_factorys_agent_run_to_the_same_record(tokenizer) -> None:
    from_tools = build_rollout(AgentChoice(tools=[lookup], system_prompt="Look things up.", name="solver"),
                               _model(tokenizer))
    tasks: list[dict[str, Any]] = []

    def factory(model: RLLMModel, task: dict[str, Any]) -> Agent:
        tasks.append(task)
        return Agent(model=model, tools=[lookup], system_prompt="Look things up.", name="solver")

    from_factory = build_rollout(AgentChoice(agent_factory=factory, quiet=True), _model(tokenizer), {"id": "t"})

    assert tasks == [{"id": "t"}] and list(from_factory.recorders) == list(from_tools.recorders) == ["solver"]
    assert not isinstance(from_factory.built.callback_handler, PrintingCallbackHandler)  # quiet: no token stream
    records = [await rollout.run("What does alpha hold?", response_length=64) for rollout in (from_tools, from_factory)]
    assert [r.end.reason for r in records] == [TerminationReason.FINISHED] * 2
    assert [r.end.final_answer for r in records] == ["\\boxed{7}"] * 2
    assert records[0].samples == records[1].samples  # the same tokens, whoever built the agent


@pytest.mark.parametrize(("built", "message"), [
    ("an answer", "my.module:agent: an agent factory returned a str, not a Strands Agent, Swarm or Graph"),
    (None, "my.module:agent: an agent factory returned a NoneType"),
])
def test_what_a_factory_returns_that_rllm_cannot_record_is_a_configuration_error(tokenizer, built: Any,
                                                                               message: str) -> None:
    choice = AgentChoice(agent_factory=lambda model, task: built, who="my.module:agent")
    with pytest.raises(ConfigurationError, match=message):
        build_rollout(choice, _model(tokenizer), {})


def test_an_agent_on_another_model_is_refused_unless_the_door_serves_its_own_client(tokenizer) -> None:
    model = _model(tokenizer)
    elsewhere = Agent(model=_elsewhere(), name="solver", callback_handler=None)
    with pytest.raises(ConfigurationError, match=r"my.module:agent built agent 'solver' on another model "
                                                 r"\(OpenAIModel\); pass it the model"):
        build_rollout(AgentChoice(agent_factory=lambda m, t: elsewhere, who="my.module:agent",
                                  fix="pass it the model"), model, {})
    own = build_rollout(AgentChoice(agent_factory=lambda m, t: Agent(model=_elsewhere(), callback_handler=None),
                                    client=ClientRule.MAY_OWN), model, {})
    assert own.on_own_client
    on_model = build_rollout(AgentChoice(agent_factory=lambda m, t: Agent(model=m, callback_handler=None),
                                         client=ClientRule.MAY_OWN), model, {})
    assert not on_model.on_own_client  # runs on the rollout's model, as without own_client
    with pytest.raises(ConfigurationError, match="with trace_store, agent_factory builds the agent on its own traced"):
        build_rollout(AgentChoice(agent_factory=lambda m, t: Agent(model=m, callback_handler=None),
                                  client=ClientRule.TRACED, who="with trace_store, agent_factory"), model, {})


async def test_an_agent_on_its_own_client_does_not_run_without_the_doors_own_client(tokenizer) -> None:
    elsewhere = Agent(model=_elsewhere(), name="solver", callback_handler=None)
    own = build_rollout(AgentChoice(agent_factory=lambda m, t: elsewhere, client=ClientRule.MAY_OWN),
                        _model(tokenizer), {})
    with pytest.raises(ConfigurationError, match="needs the door's OwnClient"):
        await own.run("What does alpha hold?")


def test_a_factorys_error_is_its_own_in_a_rollout_and_names_the_task_before_a_run(tokenizer) -> None:
    def factory(model: RLLMModel, task: dict[str, Any]) -> Agent:
        return Agent(model=model, system_prompt=task["instructions"])

    choice = AgentChoice(agent_factory=factory, who="rllm.agent_loop.agent_factory=my.module:agent")
    with pytest.raises(KeyError, match="instructions"):  # a rollout raises what the user's code raised
        build_rollout(choice, _model(tokenizer), {"question": "?"})
    with pytest.raises(ConfigurationError, match=r"^rllm.agent_loop.agent_factory=my.module:agent raised on train "
                                                 r"task 3 \(KeyError: 'instructions'\)") as caught:
        build_rollout(choice, _model(tokenizer), {"question": "?"}, where="train task 3")
    assert isinstance(caught.value.__cause__, KeyError)
