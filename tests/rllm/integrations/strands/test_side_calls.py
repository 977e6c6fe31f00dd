"""Side calls, discarded answers and run state: every trained token is a recorded step, and only those.

Real Strands agents with Strands' own context managers (``context_manager="auto"``, ``"agentic"``, the
``proactive_summarization`` preset) and its ``SummarizingConversationManager``, unchanged, over a
scripted token policy writing real Qwen3 token ids with Qwen3's shipped template. What is checked is
what a consumer of the Episode reads: each sample's steps are exactly its sampled turns, every sampled
token is in exactly one sample, and what the agent threw away is in none.
"""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.strands_agents import lookups_then_answer
from strands import Agent
from strands.agent.conversation_manager import SummarizingConversationManager
from strands.hooks import AfterModelCallEvent, HookProvider, HookRegistry
from strands.multiagent import GraphBuilder

from rllm.engine.rollout.token_engine import TokenOutput, TokenSession
from rllm.integrations.strands import RLLMModel, StrandsAgent, record
from rllm.integrations.strands._turns import mark_turn, take_back
from rllm.integrations.strands.rollout import FinishedRollout, finished_rollout, read_rollout, run_rollout
from rllm.integrations.strands.teams import record_team, run_team_rollout
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.types import Trajectory

SYSTEM = "Look things up, then answer with \\boxed{}."
SUMMARY = "Summary: I looked keys up."


class _CountingEngine(ScriptedTokenEngine):
    """The scripted engine, keeping every token it sampled (what could be trained)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list[list[int]] = []

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        output = await super()._generate(prompt_ids, max_new_tokens, sampling, session)
        self.outputs.append(list(output.token_ids))
        return output


def _summarizing(script: Any) -> Any:
    """The policy, answering a summary request (either of Strands' summary prompts) with ``SUMMARY``."""
    def answer(prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "summarization assistant" in prompt or "Please summarize this conversation." in last_user:
            return SUMMARY
        return script(prompt)
    return answer


def check_record(trajectories: list[Trajectory]) -> None:
    """Each sample's steps are exactly its sampled turns, in order, token for token."""
    for trajectory in trajectories:
        trace = trajectory.token_trace
        if trace is None:
            continue
        trace.check()
        turns = [trace.token_ids[s.start : s.end] for s in trace.segments if s.kind == "sampled"]
        assert len(trajectory.steps) == trace.num_turns == len(turns)
        assert [step.model_output.completion_ids for step in trajectory.steps] == turns


def trained_tokens(finished: FinishedRollout) -> list[int]:
    """The tokens with loss mask 1 over the rollout's exported samples."""
    return [t for s in finished.samples for t, m in zip(s["response_ids"], s["response_mask"], strict=True) if m]


def long_agent(tokenizer: Any, context_manager: Any) -> tuple[_CountingEngine, Agent]:
    """A plain Strands agent on ``RLLMModel`` with a small context window, looking eight keys up."""
    script, lookup = lookups_then_answer(8, result_chars=60)
    engine = _CountingEngine(tokenizer, _summarizing(script))
    model = RLLMModel(engine, context_window_limit=900)
    agent = Agent(model=model, tools=[lookup], system_prompt=SYSTEM, context_manager=context_manager,
                  callback_handler=None)
    return engine, agent


@pytest.mark.parametrize("context_manager", ["auto", "agentic", {"strategies": ["proactive_summarization"]}],
                         ids=["auto", "agentic", "proactive_summarization"])
async def test_a_context_managers_summaries_are_recorded_steps_trained_once(tokenizer, context_manager) -> None:
    engine, agent = long_agent(tokenizer, context_manager)
    recorder = record(agent)

    finished = await run_rollout(agent, "Find k0 to k7.", recorder=recorder)

    assert finished.end.reason.value == "finished" and finished.end.final_answer == "\\boxed{done}"
    check_record(finished.trajectories)
    side = [s for t in finished.trajectories for s in t.steps if s.info.get("side_call")]
    assert side and all(s.model_output.text == SUMMARY for s in side)
    assert finished.metrics["side_calls"] == len(side) and finished.metrics["turns"] == 9
    # Every call the engine served is a step, and every token it sampled is trained exactly once.
    assert sum(len(t.steps) for t in finished.trajectories) == len(engine.outputs)
    assert sorted(trained_tokens(finished)) == sorted(t for out in engine.outputs for t in out)
    assert finished.num_model_calls == len(engine.outputs)


async def test_the_summarizing_conversation_managers_summary_is_a_recorded_step(tokenizer) -> None:
    script, lookup = lookups_then_answer(5, result_chars=60)
    engine = _CountingEngine(tokenizer, _summarizing(script), context_length=700)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM,
                         conversation_manager=SummarizingConversationManager(summary_ratio=0.5,
                                                                             preserve_recent_messages=2))

    finished = await run_rollout(agent, "Find k0 to k4.")

    assert finished.end.reason.value == "finished" and finished.end.final_answer == "\\boxed{done}"
    check_record(finished.trajectories)
    assert finished.metrics["side_calls"] >= 1 and finished.metrics["turns"] == 6
    assert sorted(trained_tokens(finished)) == sorted(t for out in engine.outputs for t in out)


class _RetryOnce(HookProvider):
    """A user's hook that throws the agent's first answer away: Strands calls the model again."""

    def __init__(self) -> None:
        self.retried = False

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(AfterModelCallEvent, self._after)

    def _after(self, event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and not self.retried:
            self.retried = event.retry = True


@pytest.mark.parametrize("door", ["record", "StrandsAgent"])
async def test_an_answer_the_agent_discarded_is_taken_back_and_counted(tokenizer, door) -> None:
    # ``record`` attaches the recorder after the user's hook, StrandsAgent before it: Strands runs the
    # AfterModelCallEvent callbacks in reverse, so the recorder sees the retry after, or before, it is asked.
    script, lookup = lookups_then_answer(2)
    engine = _CountingEngine(tokenizer, script)
    if door == "record":
        agent: Agent = Agent(model=RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM, hooks=[_RetryOnce()],
                             callback_handler=None)
        recorder = record(agent)
    else:
        agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM, hooks=[_RetryOnce()])
        recorder = agent.recorder

    finished = await run_rollout(agent, "Find k0 and k1.", recorder=recorder)

    assert finished.end.reason.value == "finished"
    assert finished.metrics["discarded_answers"] == 1 and len(engine.outputs) == 3
    check_record(finished.trajectories)
    # The retry continues the same sample; the discarded answer's tokens are in no sample.
    assert len(finished.samples) == 1 and finished.metrics["turns"] == 2
    assert trained_tokens(finished) == [t for out in engine.outputs[1:] for t in out]


async def test_a_call_on_the_model_after_the_run_samples_in_no_rollout(tokenizer) -> None:
    # A reward judge on the same RLLMModel after the agent's run: not a sample of the finished rollout.
    script, lookup = lookups_then_answer(1)
    engine = _CountingEngine(tokenizer, lambda prompt: "yes" if "Judge" in prompt else script(prompt))
    model = RLLMModel(engine)
    agent = StrandsAgent(model, tools=[lookup], system_prompt=SYSTEM)
    finished = await run_rollout(agent, "Find k0.")
    turns = [t.num_turns for t in agent.token_session.samples]

    events = [e async for e in model.stream([{"role": "user", "content": [{"text": "Judge: is it right?"}]}])]

    assert events and len(engine.outputs) == 3
    assert [t.num_turns for t in agent.token_session.samples] == turns == [2]
    assert finished.metrics["side_calls"] == 0 and sum(len(t.steps) for t in agent.trajectories) == 2


async def test_the_records_metrics_count_side_calls_discards_rewrites_and_malformed_calls(tokenizer) -> None:
    calls = iter(['<tool_call>\n{"name": "lookup", "arguments": {"key": \n</tool_call>', "\\boxed{done}"])
    engine = _CountingEngine(tokenizer, lambda prompt: next(calls))
    _, lookup = lookups_then_answer(0)
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt=SYSTEM)
    session = TokenSession()
    session.rewritten_calls = 2  # type: ignore[attr-defined]  # what the token engine counts

    await agent.invoke_async("Find k0.")
    end = read_rollout(agent.recorder, None, "end_turn")
    finished = finished_rollout(end, None, agent.trajectories, 0.0, None, agents=[agent],
                                token_sessions=[*agent.recorder.token_sessions, session])

    assert finished.metrics["malformed_tool_calls"] == 1 and finished.metrics["rewritten_calls"] == 2
    assert finished.metrics["side_calls"] == 0 and finished.metrics["discarded_answers"] == 0


def test_a_discarded_turn_that_others_follow_in_its_sample_is_masked_in_place() -> None:
    session = TokenSession()
    session.trace.add_prompt([1, 2, 3])
    before = session.mark()
    session.trace.add_sampled([4, 5], [-0.1, -0.2])
    turn = mark_turn(session, before)
    session.trace.add_context([6])
    session.trace.add_sampled([7], [-0.3])

    assert take_back(turn) is False

    trace = session.trace
    assert trace.token_ids == [1, 2, 3, 4, 5, 6, 7] and trace.num_turns == 1
    assert trace.loss_mask == [0, 0, 0, 0, 0, 0, 1] and trace.logprobs[3:5] == [0.0, 0.0]
    assert [s.turn for s in trace.segments] == [0, 0, 0, 0]


def test_a_discarded_last_turn_is_taken_back_and_the_session_continues_before_it() -> None:
    session = TokenSession()
    session.trace.add_prompt([1, 2])
    session.trace.add_sampled([3], [-0.1])
    session.messages = [{"role": "user", "content": "a"}]
    before = session.mark()
    session.trace.add_context([4])
    session.trace.add_sampled([5, 6], [-0.1, -0.2])
    session.messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    turn = mark_turn(session, before)

    assert take_back(turn) is True

    assert session.trace.token_ids == [1, 2, 3] and session.messages == [{"role": "user", "content": "a"}]


async def test_a_team_nodes_summaries_are_steps_of_that_node(tokenizer) -> None:
    # A Graph runs each node in a task of its own: a node's side calls go to that node's run and record.
    script, lookup = lookups_then_answer(8, result_chars=60)
    engine = _CountingEngine(tokenizer, _summarizing(script))
    model = RLLMModel(engine, context_window_limit=900)
    researcher = Agent(name="researcher", model=model, tools=[lookup], system_prompt=SYSTEM, context_manager="auto",
                       callback_handler=None)
    writer = Agent(name="writer", model=model, system_prompt="Write the answer.", callback_handler=None)
    builder = GraphBuilder()
    builder.add_node(researcher, "researcher")
    builder.add_node(writer, "writer")
    builder.add_edge("researcher", "writer")
    team = builder.build()

    finished = await run_team_rollout(team, "Find k0 to k7.", recorders=record_team(team))

    assert finished.end.reason.value == "finished"
    check_record(finished.trajectories)
    side = [(t.name, s) for t in finished.trajectories for s in t.steps if s.info.get("side_call")]
    assert side and {name for name, _ in side} == {"researcher"} and finished.metrics["side_calls"] == len(side)
    assert sorted(trained_tokens(finished)) == sorted(t for out in engine.outputs for t in out)
