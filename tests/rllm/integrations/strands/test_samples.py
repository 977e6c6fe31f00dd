"""A history that a conversation manager rewrites becomes new samples, each exact, never an error.

Real Strands agents with Strands' own ``SlidingWindowConversationManager`` (per turn, and on a
context overflow), unchanged, over a scripted token policy that writes real Qwen3 token ids with
Qwen3's shipped template. What is checked is what training reads: every sampled token in exactly
one sample with its logprob and mask 1, each sample's prompt the template's render of the
rewritten messages its first call was sent, and one trajectory per sample.
"""

from __future__ import annotations

import json
from typing import Any

from fixtures.strands_agents import lookups_then_answer
from strands.agent.conversation_manager import SlidingWindowConversationManager, SummarizingConversationManager

from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.integrations.strands.rollout import run_rollout
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.types import Trajectory

SYSTEM = "Look things up, then answer with \\boxed{}."


def windowed_agent(tokenizer: Any, lookups: int, window: int) -> tuple[ScriptedTokenEngine, StrandsAgent]:
    """A scripted policy making ``lookups`` calls, run by an agent under Strands' per-turn sliding window."""
    script, lookup = lookups_then_answer(lookups)
    engine = ScriptedTokenEngine(tokenizer, script)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM,
                         conversation_manager=SlidingWindowConversationManager(window_size=window, per_turn=True))
    return engine, agent


def check_samples(engine: ScriptedTokenEngine, trajectories: list[Trajectory]) -> None:
    """Every call's sampled tokens exactly once, at the right place of its own sample; each prompt a full render."""
    for trajectory in trajectories:
        trace = trajectory.token_trace
        assert trace is not None and trajectory.steps
        trace.check()
        first = trajectory.steps[0]
        assert trace.token_ids[: trace.prompt_length] == engine.renderer.prompt_ids(first.messages, first.tools)
        sampled: list[int] = []
        for step in trajectory.steps:
            output = step.model_output
            start = len(output.prompt_ids)
            assert trace.token_ids[:start] == output.prompt_ids  # token-in/token-out within the sample
            assert trace.token_ids[start : start + len(output.completion_ids)] == output.completion_ids
            assert trace.loss_mask[start : start + len(output.completion_ids)] == [1] * len(output.completion_ids)
            assert trace.logprobs[start : start + len(output.completion_ids)] == output.logprobs
            sampled += output.completion_ids
        assert [t for t, m in zip(trace.token_ids, trace.loss_mask, strict=True) if m] == sampled


async def test_a_per_turn_sliding_window_makes_new_samples_each_exact(tokenizer) -> None:
    engine, agent = windowed_agent(tokenizer, 6, 4)

    finished = await run_rollout(agent, "Find k0 to k5.")

    assert finished.end.reason.value == "finished" and finished.end.final_answer == "\\boxed{done}"
    trajectories = agent.trajectories
    assert len(trajectories) > 1  # the window rewrote the history: not an error, new samples
    assert [t.info["sample"] for t in trajectories] == list(range(len(trajectories)))
    assert {t.name for t in trajectories} == {"agent"}
    assert sum(len(t.steps) for t in trajectories) == 7  # six lookups and the answer, each recorded once
    assert [t.token_trace for t in trajectories] == agent.token_session.samples
    check_samples(engine, trajectories)
    # A later sample starts from the window, not from the first question.
    later = trajectories[-1].steps[0].messages
    assert len(later) <= 1 + 4 and not any("Find k0 to k5." in json.dumps(m) for m in later)
    # What training reads: one set of verl fields per sample, the samples' sampled tokens all of the rollout's.
    assert len(finished.samples) == len(trajectories) and finished.num_model_calls == 7
    sampled = sum(sum(fields["response_mask"]) for fields in finished.samples)
    assert sampled == sum(len(s.model_output.completion_ids) for t in trajectories for s in t.steps)
    assert finished.metrics["samples"] == len(trajectories) and finished.metrics["tool_calls"] == 6


async def test_an_overflow_that_strands_reduces_continues_in_a_new_sample(tokenizer) -> None:
    # Strands' default manager (not per turn) trims only when the model reports a context overflow.
    script, lookup = lookups_then_answer(5, result_chars=60)
    engine = ScriptedTokenEngine(tokenizer, script, context_length=700)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM,
                         conversation_manager=SlidingWindowConversationManager())

    finished = await run_rollout(agent, "Find k0 to k4.")

    assert finished.end.reason.value == "finished"
    trajectories = agent.trajectories
    assert len(trajectories) >= 2
    check_samples(engine, trajectories)
    assert all(len(t.token_trace) <= 700 for t in trajectories)
    assert sum(len(t.steps) for t in trajectories) == 6


async def test_a_summary_that_strands_asks_the_model_for_is_a_sample_of_the_rollout(tokenizer) -> None:
    # Strands' SummarizingConversationManager, on a context overflow, calls the agent's model without model
    # state; the summary is still sampled in the rollout's session, so its tokens train with the rollout,
    # and it is a step of its own sample (a side call), so the record shows what is trained.
    script, lookup = lookups_then_answer(5, result_chars=60)
    engine = ScriptedTokenEngine(tokenizer, script, context_length=700)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM,
                         conversation_manager=SummarizingConversationManager(summary_ratio=0.5,
                                                                             preserve_recent_messages=2))

    finished = await run_rollout(agent, "Find k0 to k4.")

    assert finished.end.reason.value == "finished"
    samples = agent.token_session.samples
    summaries = [t for t in agent.trajectories if all(s.info.get("side_call") for s in t.steps)]
    assert summaries and all(len(t.steps) == 1 and "Summary: I looked keys up." in tokenizer.decode(
        [i for i, m in zip(t.token_trace.token_ids, t.token_trace.loss_mask, strict=True) if m]) for t in summaries)
    check_samples(engine, agent.trajectories)
    assert finished.metrics["side_calls"] == len(summaries) and finished.metrics["turns"] == 6
    # Every call the engine served, the summary included, is sampled in exactly one sample of the rollout.
    assert sum(t.num_turns for t in samples) == len(engine.prompts) == 6 + len(summaries)
    assert len(finished.samples) == len(samples)


async def test_an_append_only_history_stays_one_sample(tokenizer) -> None:
    engine, agent = windowed_agent(tokenizer, 3, 40)

    finished = await run_rollout(agent, "Find k0 to k2.")

    assert len(agent.trajectories) == 1 and len(finished.samples) == 1 and len(agent.trajectory.steps) == 4
    check_samples(engine, agent.trajectories)


async def test_reset_forgets_the_samples(tokenizer) -> None:
    _, agent = windowed_agent(tokenizer, 6, 4)
    await run_rollout(agent, "Find k0 to k5.")
    assert len(agent.trajectories) > 1

    agent.reset()

    assert len(agent.trajectories) == 1 and agent.trajectory.steps == [] and agent.token_session is None


def test_the_agents_name_is_its_strands_name_and_its_trajectories_name() -> None:
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), lambda prompt: "ok")
    agent = StrandsAgent(RLLMModel(engine), name="researcher")
    assert agent.name == "researcher" and agent.trajectory.name == "researcher"
