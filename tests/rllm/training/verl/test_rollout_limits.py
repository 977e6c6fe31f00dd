"""A rollout's limits are the rollout's: its response budget over all its samples, its overflow its own ending.

The loop is built as verl's ``AgentLoopWorker`` builds it (``fixtures.verl_loop``), the agent is a
user's plain ``strands.Agent`` under Strands' per-turn ``SlidingWindowConversationManager`` (each
call a rewritten history, so each call a sample), and the rollout server is a fake ``server_manager``
answering scripted text through the real tokenizer. A team (``fixtures.verl_loop:research_team``, a Strands
``Swarm``; a ``Graph``) is one rollout too: a node's hand-off longer than ``prompt_length`` ends that rollout,
only the task itself too long stops the run; a split rollout that used up the response budget is truncated.
"""

from __future__ import annotations

import os

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from typing import Any  # noqa: E402

import pytest  # noqa: E402
from fixtures.verl_loop import (  # noqa: E402
    QUESTION,
    SAMPLING,
    FakeServerManager,
    build_loop,
    lookup_call,
    row,
    windowed_agent,
)
from strands import Agent  # noqa: E402
from strands.multiagent import GraphBuilder  # noqa: E402

from rllm.engine.rollout.verl_engine import VerlEngine  # noqa: E402
from rllm.errors import PromptTooLongError  # noqa: E402
from rllm.integrations.strands import RLLMModel, record  # noqa: E402
from rllm.integrations.strands.rollout import run_rollout  # noqa: E402
from rllm.integrations.strands.teams import record_team, run_team_rollout  # noqa: E402
from rllm.types import TerminationReason  # noqa: E402

WINDOWED = {"tool_factory": None, "agent_factory": "fixtures.verl_loop:windowed_agent"}


def _looks_up_forever(prompt: str) -> str:
    return lookup_call("France")


def _answers_after_four_lookups(prompt: str) -> str:
    return lookup_call("France") if prompt.count("<tool_response>") < 4 else "It is \\boxed{Paris}."


async def test_a_rollout_split_by_a_sliding_window_stays_within_max_response_length(tokenizer) -> None:
    server = FakeServerManager(tokenizer, _looks_up_forever)
    loop, config = build_loop(tokenizer, server, "data.max_response_length=120", **WINDOWED)

    outputs = await loop.run(dict(SAMPLING), **row())

    assert len(outputs) > 1  # split: the window rewrote the history
    # The rollout's response (sampled and tool tokens after each sample's prompt) is 120 in all, as for one sample.
    assert sum(len(o.response_ids) for o in outputs) == config.actor_rollout_ref.rollout.response_length == 120
    sampled = sum(len(call["token_ids"]) for call in server.calls)
    assert sum(sum(o.response_mask) for o in outputs) == sampled < 120
    assert outputs[-1].extra_fields["termination_reason"] == "max_tokens"


async def test_a_rewritten_history_longer_than_prompt_length_ends_that_rollout_as_context_overflow(tokenizer) -> None:
    # verl stores each sample as a row whose prompt must fit rollout.prompt_length: a trimmed history may not.
    loop, _ = build_loop(tokenizer, FakeServerManager(tokenizer, _answers_after_four_lookups), **WINDOWED)
    outputs = await loop.run(dict(SAMPLING), **row())
    first, later = len(outputs[0].prompt_ids), max(len(o.prompt_ids) for o in outputs[1:])
    assert later > first
    server = FakeServerManager(tokenizer, _answers_after_four_lookups)
    loop, _ = build_loop(tokenizer, server, f"data.max_prompt_length={first}", **WINDOWED)

    outputs = await loop.run(dict(SAMPLING), **row())  # the rollout ends; the run does not stop

    extra = outputs[-1].extra_fields
    assert extra["termination_reason"] == "context_overflow" and extra["infra_failure"] is False
    assert all(len(o.prompt_ids) <= first for o in outputs)  # every stored row fits verl's prompt length
    assert [t for o in outputs for t, m in zip(o.response_ids, o.response_mask, strict=True) if m] == [
        t for c in server.calls for t in c["token_ids"]]  # what it sampled before, trained as sampled


async def test_a_first_prompt_longer_than_prompt_length_is_still_a_configuration_error(tokenizer) -> None:
    import pytest

    from rllm.errors import PromptTooLongError

    loop, _ = build_loop(tokenizer, FakeServerManager(tokenizer, _looks_up_forever), "data.max_prompt_length=8",
                         **WINDOWED)
    with pytest.raises(Exception, match="the first prompt has \\d+ tokens but rollout.prompt_length is 8") as raised:
        await loop.run(dict(SAMPLING), **row())
    assert isinstance(raised.value, PromptTooLongError) or isinstance(raised.value.__cause__, PromptTooLongError)


async def test_every_sample_reports_the_rows_task_and_the_agents_tools_for_the_guards(tokenizer) -> None:
    from fixtures.verl_loop import team_script

    server = FakeServerManager(tokenizer, _answers_after_four_lookups)
    loop, _ = build_loop(tokenizer, server, **WINDOWED)
    outputs = await loop.run(dict(SAMPLING), **row())
    calls = len(server.calls)
    spain = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Capital of Spain?"}]
    other = await loop.run(dict(SAMPLING), **row(raw_prompt=spain))

    assert {o.extra_fields["task_prompt"] for o in outputs} == {outputs[0].extra_fields["task_prompt"]}
    assert other[0].extra_fields["task_prompt"] != outputs[0].extra_fields["task_prompt"]  # another row
    assert {o.extra_fields["num_tools"] for o in outputs} == {1}  # the lookup tool
    assert {o.extra_fields["num_model_calls"] for o in outputs} == {calls}
    team, _ = build_loop(tokenizer, FakeServerManager(tokenizer, team_script), tool_factory=None,
                         agent_factory="fixtures.verl_loop:research_team")
    assert {o.extra_fields["num_tools"] for o in await team.run(dict(SAMPLING), **row())} == {1}  # no handoff tool


HAND_OFF = "Paris is the capital of France. " * 12
"""What the researcher hands the writer: long enough that the writer's first prompt is longer than the researcher's."""


def _hands_off_at_length(prompt: str) -> str:
    """The research team's policy (``fixtures.verl_loop.team_script``) with a long hand-off message."""
    system, turn = prompt.split("<|im_end|>", 1)[0], prompt.rsplit("<|im_start|>user", 1)[-1]
    if "You write." in system:
        return "It is \\boxed{Paris}."
    if "Handing off to" in turn:
        return "Handed off."
    if "<tool_response>" not in turn:
        return lookup_call("France")
    return ('<tool_call>\n{"name": "handoff_to_agent", "arguments": {"agent_name": "writer", "message": "'
            + HAND_OFF + '"}}\n</tool_call>')


TEAM = {"tool_factory": None, "agent_factory": "fixtures.verl_loop:research_team"}


async def _first_prompts(tokenizer) -> tuple[int, int]:
    """The researcher's first prompt and the writer's (the hand-off), in tokens, with no prompt limit in the way."""
    server = FakeServerManager(tokenizer, _hands_off_at_length)
    loop, _ = build_loop(tokenizer, server, **TEAM)
    outputs = await loop.run(dict(SAMPLING), **row())
    by_node = {o.extra_fields["agent"]: len(o.prompt_ids) for o in outputs}
    assert by_node["writer"] > by_node["researcher"]
    return by_node["researcher"], by_node["writer"]


async def test_a_team_nodes_hand_off_longer_than_prompt_length_ends_that_rollout_as_context_overflow(
        tokenizer) -> None:
    researcher, writer = await _first_prompts(tokenizer)
    server = FakeServerManager(tokenizer, _hands_off_at_length)
    loop, _ = build_loop(tokenizer, server, f"data.max_prompt_length={writer - 1}", **TEAM)

    outputs = await loop.run(dict(SAMPLING), **row())  # the rollout ends; the run does not stop

    extra = outputs[-1].extra_fields
    assert extra["termination_reason"] == "context_overflow" and extra["infra_failure"] is False
    assert {o.extra_fields["agent"] for o in outputs} == {"researcher"}  # the first node's trajectory, kept
    assert len(outputs[0].prompt_ids) == researcher
    assert [t for o in outputs for t, m in zip(o.response_ids, o.response_mask, strict=True) if m] == [
        t for c in server.calls for t in c["token_ids"]]  # what it sampled, trained as sampled
    entry = server.calls[0]["prompt_ids"]
    assert all(c["prompt_ids"][:researcher] == entry for c in server.calls)  # the writer's prompt was never sent


async def test_an_entry_nodes_first_prompt_longer_than_prompt_length_is_still_a_configuration_error(
        tokenizer) -> None:
    researcher, _ = await _first_prompts(tokenizer)
    server = FakeServerManager(tokenizer, _hands_off_at_length)
    loop, _ = build_loop(tokenizer, server, f"data.max_prompt_length={researcher - 1}", **TEAM)

    with pytest.raises(PromptTooLongError, match=f"the first prompt has {researcher} tokens but rollout.prompt_length"):
        await loop.run(dict(SAMPLING), **row())  # the task itself is too long: a data or configuration error
    assert server.calls == []


async def test_a_graph_nodes_input_longer_than_prompt_length_is_that_rollouts_overflow_its_entrys_is_not(
        tokenizer) -> None:
    def policy(prompt: str) -> str:  # the researcher reports at length; the writer answers
        return "It is \\boxed{Paris}." if "You write." in prompt.split("<|im_end|>", 1)[0] else HAND_OFF

    async def run(prompt_length: int | None) -> tuple[Any, FakeServerManager]:
        server = FakeServerManager(tokenizer, policy)
        model = RLLMModel(VerlEngine(server, tokenizer, prompt_length=prompt_length, server_sampling=SAMPLING))
        builder = GraphBuilder()
        builder.add_node(Agent(model=model, name="r", system_prompt="You research.", callback_handler=None), "research")
        builder.add_node(Agent(model=model, name="w", system_prompt="You write.", callback_handler=None), "write")
        builder.add_edge("research", "write")
        builder.set_max_node_executions(2)
        graph = builder.build()
        return await run_team_rollout(graph, QUESTION, recorders=record_team(graph)), server

    whole, _ = await run(None)
    first, writer = (len(s["prompt_ids"]) for s in whole.samples)
    assert whole.sample_names == ["research", "write"] and writer > first

    overflowed, server = await run(writer - 1)
    assert overflowed.end.reason is TerminationReason.CONTEXT_OVERFLOW and overflowed.end.scored
    assert overflowed.sample_names == ["research"] and len(server.calls) == 1
    overflowed.raise_if_unexpected()  # the rollout's outcome: nothing is raised

    too_long, server = await run(first - 1)
    assert too_long.end.reason is TerminationReason.ERROR and server.calls == []
    with pytest.raises(PromptTooLongError):
        too_long.raise_if_unexpected()


async def test_a_split_rollout_that_used_up_max_response_length_is_truncated_as_an_unsplit_one(tokenizer) -> None:
    engine = VerlEngine(FakeServerManager(tokenizer, _looks_up_forever), tokenizer, response_length=120,
                        server_sampling=SAMPLING)
    agent = windowed_agent(RLLMModel(engine), row())
    finished = await run_rollout(agent, QUESTION, recorder=record(agent), response_length=120)
    responses = [len(s["response_ids"]) for s in finished.samples]
    assert len(responses) > 1 and max(responses) < 120 and sum(responses) == 120  # no sample alone was cut
    assert finished.end.reason is TerminationReason.MAX_TOKENS and finished.truncated

    loop, _ = build_loop(tokenizer, FakeServerManager(tokenizer, _looks_up_forever), "data.max_response_length=120",
                         **WINDOWED)
    outputs = await loop.run(dict(SAMPLING), **row())
    assert len(outputs) > 1
    assert {o.extra_fields["response_truncated"] for o in outputs} == {True}  # what the truncation guard reads

    within, _ = build_loop(tokenizer, FakeServerManager(tokenizer, _answers_after_four_lookups), **WINDOWED)
    outputs = await within.run(dict(SAMPLING), **row())  # split too, but finished within its budget
    assert len(outputs) > 1 and {o.extra_fields["response_truncated"] for o in outputs} == {False}
