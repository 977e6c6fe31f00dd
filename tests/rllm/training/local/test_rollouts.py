"""Local rollouts raise on what must not be trained: an aborted generation, a cancelled run.

A local run has no other rollouts to fall back on. Real Strands agent and tool, Qwen's real
tokenizer and Qwen3's shipped template, a scripted token policy.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import ToolContext, tool

from rllm.errors import ConfigurationError, GenerationAbortedError, RolloutCancelledError
from rllm.integrations.strands import Budget
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import Cut, ScriptedTokenEngine
from rllm.training.local import RolloutRequest, run_rollouts

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
LOOKUPS: list[str] = []


@tool(context=True)
def lookup(key: str, tool_context: ToolContext) -> str:
    """Look a key up; the key "stop" cancels the run."""
    LOOKUPS.append(key)
    if key == "stop":
        tool_context.agent.cancel()
    return f"{key} holds 7"


async def _run(script: Any) -> None:
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), script)
    await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {})], tools=[lookup],
                       system_prompt="Answer in \\boxed{}.", budget=Budget(), response_length=512)


async def test_an_aborted_generation_raises_and_its_cut_call_never_runs() -> None:
    LOOKUPS.clear()
    with pytest.raises(GenerationAbortedError, match="aborted the generation"):
        await _run(lambda prompt: Cut(CALL))
    assert LOOKUPS == []


async def test_a_cancelled_rollout_raises() -> None:
    LOOKUPS.clear()
    with pytest.raises(RolloutCancelledError, match="cancelled"):
        await _run(lambda prompt: "\\boxed{7}" if "<tool_response>" in prompt else CALL.replace("alpha", "stop"))
    assert LOOKUPS == ["stop"]


def _policy(prompt: str) -> str:
    return "\\boxed{7}" if prompt.count("<tool_response>") >= 3 else CALL


async def test_a_factorys_plain_agent_gives_the_local_trainer_its_exact_tokens() -> None:
    from strands import Agent

    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), _policy)
    tasks: list[dict[str, Any]] = []

    def factory(model: Any, task: dict[str, Any]) -> Agent:
        tasks.append(task)
        return Agent(model=model, tools=[lookup], system_prompt="Answer in \\boxed{}.", callback_handler=None)

    [rollout] = await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {}, task={"id": "t0"})],
                                   agent_factory=factory, budget=Budget(max_model_turns=6), response_length=1024)

    assert tasks == [{"id": "t0"}]
    assert rollout.reason.value == "finished" and rollout.final_answer == "\\boxed{7}"
    fields = rollout.fields
    assert fields["prompt_ids"] == engine.prompts[0] and len(engine.prompts) == 4
    whole = fields["prompt_ids"] + fields["response_ids"]
    assert whole[: len(engine.prompts[-1])] == engine.prompts[-1]  # token-in/token-out up to the last call


async def test_a_factorys_rollout_split_into_samples_is_refused_with_where_to_train_it() -> None:
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager

    def factory(model: Any, task: dict[str, Any]) -> Agent:
        return Agent(model=model, tools=[lookup], callback_handler=None,
                     conversation_manager=SlidingWindowConversationManager(window_size=2, per_turn=True))

    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), lambda p: "\\boxed{7}" if len(p) > 900 else CALL)
    with pytest.raises(ConfigurationError, match="train it with verl's trainer"):
        await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {})], agent_factory=factory,
                           budget=Budget(max_model_turns=6), response_length=1024)


async def test_the_local_rollouts_take_tools_or_a_factory_not_both() -> None:
    with pytest.raises(ConfigurationError, match="either tools"):
        await run_rollouts(ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), _policy), [], tools=[lookup],
                           agent_factory=lambda model, task: None, budget=Budget(), response_length=8)


async def test_a_factorys_agent_on_its_own_openai_client_gives_the_local_trainer_the_same_tokens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from strands import Agent
    from strands.models.openai import OpenAIModel

    from rllm.tracing import policy_endpoint
    from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV

    for name in (BASE_URL_ENV, API_KEY_ENV, MODEL_ENV):  # run_rollouts exports the server's address here
        monkeypatch.setenv(name, "unset by the test")

    def on_model(model: Any, task: dict[str, Any]) -> Agent:
        return Agent(model=model, tools=[lookup], system_prompt="Answer in \\boxed{}.", callback_handler=None)

    def on_own_client(model: Any, task: dict[str, Any]) -> Agent:
        endpoint = policy_endpoint()
        return Agent(model=OpenAIModel(client=endpoint.async_client(max_retries=0), model_id=endpoint.model),
                     tools=[lookup], system_prompt="Answer in \\boxed{}.", callback_handler=None)

    rollouts = []
    for factory, own_client in ((on_model, False), (on_own_client, True)):
        engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), _policy)
        [rollout] = await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {})],
                                       agent_factory=factory, budget=Budget(max_model_turns=6), response_length=1024,
                                       own_client=own_client)
        rollouts.append((rollout, engine.prompts))
    (expected, expected_prompts), (rollout, prompts) = rollouts
    assert rollout.reason.value == "finished" and rollout.final_answer == "\\boxed{7}"
    assert prompts == expected_prompts and len(prompts) == 4
    assert rollout.fields == expected.fields

    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), _policy)  # on the model it is given: runs on it
    [on_its_model] = await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {})],
                                        agent_factory=on_model, budget=Budget(max_model_turns=6), response_length=1024,
                                        own_client=True)
    assert on_its_model.fields == expected.fields
    with pytest.raises(ConfigurationError, match="pass own_client=True"):  # on its own client, but not served
        await run_rollouts(ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), _policy),
                           [RolloutRequest("What does alpha hold?", "g0", {})], agent_factory=on_own_client,
                           budget=Budget(), response_length=1024)
