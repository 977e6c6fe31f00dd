"""Strands ``Swarm`` and ``Graph`` teams run as one episode: one trajectory per node (and sample), each exact.

Real Strands teams of plain ``strands.Agent`` nodes over one ``RLLMModel``, unchanged, on a scripted
token policy that writes real Qwen3 token ids with Qwen3's shipped template; the policy answers by
the node's system prompt. The Graph runs two nodes concurrently on an engine that finishes their
generations together, so each node's record is handed over while the other's is. A team's ``Budget``
is the episode's, counted over all its nodes, in evaluation as in training.
"""

from __future__ import annotations

import asyncio
from typing import Any

from strands import Agent, tool
from strands.multiagent import GraphBuilder, Swarm

from rllm.integrations.strands import Budget, RLLMModel
from rllm.integrations.strands.teams import record_team, run_team_rollout
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.rewards.base import RewardOutput
from rllm.types import TerminationReason
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow


def call(name: str, **arguments: Any) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def last_turn(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user", 1)[-1]


def team_policy(prompt: str) -> str:
    """Researchers look a key up, then hand off (Swarm) or report; the writer answers."""
    system = prompt.split("<|im_end|>", 1)[0]
    if "You write." in system:
        return "\\boxed{7}"
    key = "alpha" if "You research alpha." in system else "beta"
    if "Handing off to" in last_turn(prompt):
        return "Handed off."
    if "<tool_response>" not in last_turn(prompt):
        return call("lookup", key=key)
    if "handoff_to_agent" in prompt:
        return call("handoff_to_agent", agent_name="writer", message=f"{key} holds 7")
    return f"{key} holds 7"


class PairedEngine(ScriptedTokenEngine):
    """Answers calls in pairs, both at once (two nodes' generations finishing together, as on a served model)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: list[asyncio.Future[None]] = []

    async def _generate(self, *args: Any, **kwargs: Any) -> Any:
        arrived = asyncio.get_running_loop().create_future()
        self._waiting.append(arrived)
        if len(self._waiting) == 2:
            for future in self._waiting:
                future.set_result(None)
            self._waiting = []
        try:
            await asyncio.wait_for(asyncio.shield(arrived), timeout=0.5)  # a call with no partner goes alone
        except TimeoutError:
            self._waiting.remove(arrived)
        return await super()._generate(*args, **kwargs)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key} holds 7"


def agent(model: Any, name: str, prompt: str, tools: list[Any] | None = None) -> Agent:
    return Agent(model=model, name=name, system_prompt=prompt, tools=tools or [], callback_handler=None)


async def test_a_swarm_is_one_episode_with_a_trajectory_per_node_each_exact(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, team_policy)
    model = RLLMModel(engine)
    swarm = Swarm([agent(model, "researcher", "You research alpha.", [lookup]), agent(model, "writer", "You write.")])

    finished = await run_team_rollout(swarm, "What does alpha hold?", recorders=record_team(swarm))

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "\\boxed{7}"
    assert [t.name for t in finished.trajectories] == ["researcher", "writer"]
    researcher, writer = finished.trajectories
    assert [[c.name for c in s.tool_calls] for s in researcher.steps] == [["lookup"], ["handoff_to_agent"], []]
    assert len(writer.steps) == 1 and writer.steps[0].model_output.text == "\\boxed{7}"
    # Each node's sample is exactly what was sampled for it, and every call is in one sample.
    for trajectory in finished.trajectories:
        trace = trajectory.token_trace
        sampled = [i for step in trajectory.steps for i in step.model_output.completion_ids]
        assert [t for t, m in zip(trace.token_ids, trace.loss_mask, strict=True) if m] == sampled
    assert len(finished.samples) == 2 and finished.num_model_calls == len(engine.prompts) == 4
    assert finished.metrics["nodes"] == 2


async def test_a_graphs_concurrent_nodes_are_recorded_apart(tokenizer) -> None:
    engine = PairedEngine(tokenizer, team_policy)
    model = RLLMModel(engine)
    builder = GraphBuilder()
    builder.add_node(agent(model, "a", "You research alpha.", [lookup]), "alpha")
    builder.add_node(agent(model, "b", "You research beta.", [lookup]), "beta")
    builder.add_node(agent(model, "w", "You write."), "writer")
    builder.add_edge("alpha", "writer")
    builder.add_edge("beta", "writer")
    graph = builder.build()

    finished = await run_team_rollout(graph, "What do alpha and beta hold?", recorders=record_team(graph))

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "\\boxed{7}"
    by_node = {t.name: t for t in finished.trajectories}
    assert set(by_node) == {"alpha", "beta", "writer"}
    for node, key in (("alpha", "alpha"), ("beta", "beta")):
        steps = by_node[node].steps
        assert [s.tool_calls[0].input for s in steps if s.tool_calls] == [{"key": key}]  # its own calls only
        assert all(f"You research {key}." in s.messages[0]["content"] for s in steps)
        trace = by_node[node].token_trace
        assert [t for t, m in zip(trace.token_ids, trace.loss_mask, strict=True) if m] == [
            i for s in steps for i in s.model_output.completion_ids]
    assert finished.num_model_calls == len(engine.prompts) == 5


async def test_a_team_from_the_factory_is_evaluated_as_one_scored_episode(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, team_policy)

    def factory(model: Any, task: dict[str, Any]) -> Swarm:
        return Swarm([agent(model, "researcher", "You research alpha.", [lookup]), agent(model, "writer", "You write.")])

    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": factory,
                          "reward_fn": lambda task, answer: RewardOutput(reward=float(answer == "\\boxed{7}"),
                                                                         is_correct=answer == "\\boxed{7}")},
        engine, n_parallel_tasks=2, retry_limit=1, retry_backoff=0.0, progress=False)
    episodes = await runner.execute_tasks([{"id": "t", "question": "What does alpha hold?"}], n_rollouts=2)

    assert [e.reward for e in episodes] == [1.0, 1.0]
    for episode in episodes:
        assert [t.name for t in episode.trajectories] == ["researcher", "writer"]
        assert all(t.reward == 1.0 for t in episode.trajectories)  # one outcome for the episode


async def test_a_swarm_node_that_runs_twice_keeps_the_samples_of_both_runs(tokenizer) -> None:
    # Swarm resets a node's messages and model state before each of its runs: the second run is a new token
    # session, and the node's trajectories keep the first run's sample too.
    def policy(prompt: str) -> str:
        system, turn = prompt.split("<|im_end|>", 1)[0], last_turn(prompt)
        if "Handing off to" in turn:
            return "Handed off."
        if "You write." in system:
            return call("handoff_to_agent", agent_name="researcher", message="check it again")
        if "check it again" in prompt:
            return "\\boxed{7}"
        if "<tool_response>" not in turn:
            return call("lookup", key="alpha")
        return call("handoff_to_agent", agent_name="writer", message="alpha holds 7")

    engine = ScriptedTokenEngine(tokenizer, policy)
    model = RLLMModel(engine)
    swarm = Swarm([agent(model, "researcher", "You research alpha.", [lookup]), agent(model, "writer", "You write.")])

    finished = await run_team_rollout(swarm, "What does alpha hold?", recorders=record_team(swarm))

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "\\boxed{7}"
    researcher = [t for t in finished.trajectories if t.name == "researcher"]
    assert len(researcher) == 2  # two runs, two sessions, two samples
    assert researcher[0].token_trace is not researcher[1].token_trace
    assert [len(t.steps) for t in researcher] == [3, 1]
    assert finished.num_model_calls == len(engine.prompts) == 6


def relay_policy(prompt: str) -> str:
    """Alpha looks up and hands off to beta, beta looks up and hands off to the writer, the writer answers."""
    system, turn = prompt.split("<|im_end|>", 1)[0], last_turn(prompt)
    if "You write." in system:
        return "\\boxed{7}"
    key, after = ("alpha", "beta") if "You research alpha." in system else ("beta", "writer")
    if "Handing off to" in turn:
        return "Handed off."
    if "<tool_response>" not in turn:
        return call("lookup", key=key)
    return call("handoff_to_agent", agent_name=after, message=f"{key} holds 7")


def relay(model: Any, task: dict[str, Any] | None = None) -> Swarm:
    return Swarm([agent(model, "alpha", "You research alpha.", [lookup]),
                  agent(model, "beta", "You research beta.", [lookup]), agent(model, "writer", "You write.")])


async def test_a_teams_budget_counts_the_model_calls_of_all_its_nodes(tokenizer) -> None:
    unlimited = ScriptedTokenEngine(tokenizer, relay_policy)
    swarm = relay(RLLMModel(unlimited))
    whole = await run_team_rollout(swarm, "What do alpha and beta hold?", recorders=record_team(swarm))
    assert whole.end.reason is TerminationReason.FINISHED and len(unlimited.prompts) == 7  # 3 + 3 + 1: each under 4

    engine = ScriptedTokenEngine(tokenizer, relay_policy)
    swarm = relay(RLLMModel(engine))
    finished = await run_team_rollout(swarm, "What do alpha and beta hold?",
                                      recorders=record_team(swarm, budget=Budget(max_model_turns=4)))

    assert len(engine.prompts) == finished.num_model_calls == finished.metrics["turns"] == 4  # 4 in all, not per node
    assert finished.end.reason is TerminationReason.MAX_TURNS and finished.end.final_answer == ""  # as an agent's
    assert [t.name for t in finished.trajectories] == ["alpha", "beta"]  # the writer never got a call


async def test_a_teams_tool_call_budget_counts_the_calls_of_all_its_nodes(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, relay_policy)
    swarm = relay(RLLMModel(engine))

    finished = await run_team_rollout(swarm, "What do alpha and beta hold?",
                                      recorders=record_team(swarm, budget=Budget(max_tool_calls=3)))

    # alpha's lookup and hand-off, beta's lookup: the team's three; beta's hand-off is refused, the episode ends.
    assert finished.end.reason is TerminationReason.TOOL_BUDGET
    ran = [c.name for t in finished.trajectories for s in t.steps for c in s.tool_calls]
    assert ran == ["lookup", "handoff_to_agent", "lookup", "handoff_to_agent"]
    assert [t.name for t in finished.trajectories] == ["alpha", "beta"]


async def test_evaluation_gives_a_teams_budget_to_the_whole_episode(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, relay_policy)
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": relay, "budget": Budget(max_model_turns=4),
                          "reward_fn": lambda task, answer: float(answer == "\\boxed{7}")},
        engine, n_parallel_tasks=1, retry_limit=1, retry_backoff=0.0, progress=False)

    (episode,) = await runner.execute_tasks([{"id": "t", "question": "What do alpha and beta hold?"}], n_rollouts=1)

    assert episode.termination_reason is TerminationReason.MAX_TURNS and episode.reward == 0.0
    assert len(engine.prompts) == episode.metrics["turns"] == 4
