"""AgentWorkflowEngine + StrandsWorkflow driving whole episodes against scripted models.

The model is a real OpenAI-compatible HTTP server on 127.0.0.1 answering from a script (or a
scripted token engine over a real tokenizer), the agent a real Strands loop with a real tool.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from strands import tool

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import Budget
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.offline.scripted_tokens import ScriptedTokenEngine
from rllm.offline.tiny_models import build_tiny_tokenizer
from rllm.rewards import RewardSearchFn
from rllm.types import Episode, TerminationReason
from rllm.workflows import StrandsWorkflow, Workflow
from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine, summarize

SYSTEM = "Use the lookup tool, then answer in \\boxed{}."
FACTS = {"france": "Paris", "italy": "Rome", "spain": "Madrid", "japan": "Tokyo", "peru": "Lima", "chad": "N'Djamena"}
TASKS = [{"id": f"q-{country}", "question": f"What is the capital of {country}?", "answer": capital}
         for country, capital in FACTS.items()]


@tool
def lookup(key: str) -> str:
    """Look up the capital of a country.

    Args:
        key: The country, lower case.
    """
    return FACTS.get(key, "unknown")


def _question(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _country(text: str) -> str:
    return re.search(r"capital of (\w+)", text if isinstance(text, str) else json.dumps(text)).group(1)


def search_then_answer(body: dict[str, Any], *, wrong: bool = False) -> ScriptedReply:
    """Call lookup on the question's country, then box the tool's answer (or a wrong one)."""
    tool_results = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool_results:
        country = _country(_question(body))
        call = ScriptedToolCall("lookup", json.dumps({"key": country}), id=f"call-{country}")
        return ScriptedReply(tool_calls=[call])
    answer = "Atlantis" if wrong else tool_results[-1]["content"]
    return ScriptedReply(content=f"The capital is \\boxed{{{answer}}}.")


def make_engine(server: Any, **kwargs: Any) -> AgentWorkflowEngine:
    """An engine over StrandsWorkflow with the lookup tool, no engine-level HTTP retries."""
    rollout = OpenAIEngine(model="scripted", base_url=server.base_url, max_retries=0, timeout=60)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("retry_backoff", 0.0)
    return AgentWorkflowEngine(
        StrandsWorkflow,
        {"tools": [lookup], "system_prompt": SYSTEM, "reward_fn": RewardSearchFn(),
         "budget": Budget(max_model_turns=4)},
        rollout,
        **kwargs,
    )


def _requests_per_country(server: Any) -> Counter[str]:
    return Counter(_country(_question(body)) for body in server.requests)


# ---------------------------------------------------------------- episodes and order
async def test_episodes_are_scored_and_in_task_order(serve, tmp_path) -> None:
    # The first task is the slowest, so completion order differs from task order.
    def script(body: dict[str, Any]) -> ScriptedReply:
        reply = search_then_answer(body)
        reply.delay = {"france": 0.4, "italy": 0.2}.get(_country(_question(body)), 0.0)
        return reply

    server = serve(script)
    out = tmp_path / "episodes.jsonl"
    engine = make_engine(server, n_parallel_tasks=8, output_path=out)
    episodes = await engine.execute_tasks(TASKS[:4], n_rollouts=2)

    assert [e.id for e in episodes] == [f"{t['id']}:{r}" for t in TASKS[:4] for r in range(2)]
    for episode, task in zip(episodes, [t for t in TASKS[:4] for _ in range(2)]):
        assert episode.task == task
        assert episode.termination_reason is TerminationReason.FINISHED
        assert episode.is_correct and episode.reward == 1.0
        assert episode.info["final_answer"] == f"The capital is \\boxed{{{task['answer']}}}."
        assert episode.info["task_id"] == task["id"] and episode.info["attempts"] == 1
        assert episode.metrics["turns"] == 2 and episode.metrics["tool_calls"] == 1
        assert episode.metrics["tool_errors"] == 0 and episode.metrics["completion_tokens"] == 10
        steps = episode.trajectories[0].steps
        assert steps[0].tool_calls[0].input == {"key": _country(task["question"])}
        assert steps[0].observation[0]["content"] == task["answer"]
    lines = [Episode.model_validate_json(line) for line in out.read_text().splitlines()]
    assert len(lines) == 8
    assert lines[-1].info["task_id"] == "q-france"  # streamed as finished, not in task order
    assert engine.stats.accuracy == 1.0 and engine.stats.total == 8


async def test_tasks_without_id_use_their_index(serve) -> None:
    server = serve(search_then_answer)
    tasks = [{"question": t["question"], "answer": t["answer"]} for t in TASKS[:2]]
    episodes = await make_engine(server).execute_tasks(tasks)
    assert [e.id for e in episodes] == ["0:0", "1:0"]


async def test_duplicate_task_ids_are_refused(serve) -> None:
    server = serve(search_then_answer)
    with pytest.raises(ValueError, match="unique"):
        await make_engine(server).execute_tasks([TASKS[0], TASKS[0]])


# ---------------------------------------------------------------- concurrency
async def test_parallel_rollouts_overlap(serve) -> None:
    delay = 1.0
    server = serve(lambda body: ScriptedReply(content="\\boxed{Paris}", delay=delay))
    engine = make_engine(server, n_parallel_tasks=8)
    started = time.perf_counter()
    await engine.execute_tasks(TASKS[:1])
    one = time.perf_counter() - started
    started = time.perf_counter()
    episodes = await engine.execute_tasks([{"id": str(i), "question": "capital of france", "answer": "Paris"}
                                           for i in range(8)])
    eight = time.perf_counter() - started
    assert all(e.is_correct for e in episodes)
    assert one >= delay
    # Serial would take 8 delays; overlapping runs take about one.
    assert eight < 2.0 * one, (one, eight)


async def test_pool_size_bounds_concurrency(serve) -> None:
    delay = 1.0  # two at a time take 2 delays, one at a time 4: a second of margin each way on a loaded CPU
    server = serve(lambda body: ScriptedReply(content="\\boxed{Paris}", delay=delay))
    engine = make_engine(server, n_parallel_tasks=2)
    started = time.perf_counter()
    await engine.execute_tasks([{"id": str(i), "question": "capital of france", "answer": "Paris"} for i in range(4)])
    elapsed = time.perf_counter() - started
    assert 2 * delay <= elapsed < 4 * delay, elapsed
    assert engine._n_instances == 2


# ---------------------------------------------------------------- pooled reuse
@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


def token_script(prompt: str) -> str:
    """Call lookup on the question's country, then box the tool response (Qwen3/hermes format)."""
    turn = prompt.rsplit("<|im_start|>user", 1)[-1]
    if "<tool_response>" not in turn:
        call = {"name": "lookup", "arguments": {"key": _country(turn)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    answer = turn.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
    return f"\\boxed{{{answer}}}"


def _content(episode: Episode) -> dict[str, Any]:
    """Everything an episode records except wall-clock figures and the random per-rollout call-id prefix."""
    data = episode.model_dump()
    data["metrics"].pop("latency_s")
    return json.loads(re.sub(r"call_[0-9a-f]{8}_", "call_", json.dumps(data)))


async def test_pooled_reuse_equals_fresh(tokenizer) -> None:
    rollout = ScriptedTokenEngine(tokenizer, token_script)
    args = {"tools": [lookup], "system_prompt": SYSTEM, "reward_fn": RewardSearchFn()}
    tasks = TASKS[:3]
    pooled = AgentWorkflowEngine(StrandsWorkflow, args, rollout, n_parallel_tasks=1, progress=False)
    reused = await pooled.execute_tasks(tasks, n_rollouts=2)  # one instance runs all six
    assert pooled._n_instances == 1
    for episode in reused:
        fresh = AgentWorkflowEngine(StrandsWorkflow, args, rollout, n_parallel_tasks=1, progress=False)
        (alone,) = await fresh.execute_tasks([episode.task])
        alone.id, alone.info["rollout_index"] = episode.id, episode.info["rollout_index"]
        assert _content(alone) == _content(episode)
        trace = episode.trajectories[0].token_trace
        assert trace is not None and episode.is_correct
        assert tokenizer.decode(trace.token_ids).count("What is the capital") == 1  # no history carried over


# ---------------------------------------------------------------- failures
class RaisingWorkflow(Workflow):
    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        raise RuntimeError(f"boom on {task['id']}")


async def test_raising_workflow_yields_an_error_episode(serve) -> None:
    engine = AgentWorkflowEngine(RaisingWorkflow, {}, rollout_engine=None, progress=False, retry_backoff=0)
    episodes = await engine.execute_tasks(TASKS[:2], n_rollouts=2)
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.ERROR
        assert episode.info["error"] == f"RuntimeError: boom on {episode.task['id']}"
        assert "RuntimeError" in episode.info["traceback"] and episode.info["attempts"] == 1
        assert not episode.is_correct
    # A bug is not the policy's mistake: counted apart, never scored as a wrong answer.
    assert engine.stats.failures == engine.stats.errors == 4 and engine.stats.scored == 0


async def test_rejected_request_is_an_error_with_partial_steps_and_no_retry(serve) -> None:
    def script(body: dict[str, Any]) -> ScriptedReply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return ScriptedReply(status=400, error="unsupported parameter: foo")
        return search_then_answer(body)

    server = serve(script)
    (episode,) = await make_engine(server, retry_limit=3).execute_tasks(TASKS[:1])
    assert episode.termination_reason is TerminationReason.ERROR
    assert "unsupported parameter: foo" in episode.info["error"]
    assert len(episode.trajectories[0].steps) == 1  # the tool call that happened before the failure
    assert episode.info["attempts"] == 1 and len(server.requests) == 2


async def test_hanging_agent_times_out_and_others_finish(serve) -> None:
    def script(body: dict[str, Any]) -> ScriptedReply:
        reply = search_then_answer(body)
        if _country(_question(body)) == "italy" and any(m["role"] == "tool" for m in body["messages"]):
            reply.delay = 3.0
        return reply

    server = serve(script)
    engine = make_engine(server, rollout_timeout=0.5, retry_limit=1)
    started = time.perf_counter()
    episodes = await engine.execute_tasks(TASKS[:3])
    assert time.perf_counter() - started < 2.5
    hung = episodes[1]
    assert hung.termination_reason is TerminationReason.TIMEOUT
    assert "timeout" in hung.info["error"] and hung.info["attempts"] == 2  # a timeout is infrastructure
    assert len(hung.trajectories[0].steps) == 1  # the partial trajectory is kept
    assert [e.termination_reason for e in (episodes[0], episodes[2])] == [TerminationReason.FINISHED] * 2
    stats = engine.stats
    assert (stats.infrastructure_failures, stats.scored, stats.accuracy) == (1, 2, 1.0)


class StubbornWorkflow(Workflow):
    """Hangs on 'hang' tasks and ignores the first cancellation (the loop's teardown ends it)."""

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        if task["id"] == "hang":
            ignored = 0
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    ignored += 1
                    if ignored > 1:
                        raise
        return Episode(id=uid, task=task, is_correct=True, reward=1.0)


async def test_instance_that_ignores_cancellation_is_replaced() -> None:
    engine = AgentWorkflowEngine(StubbornWorkflow, {}, None, n_parallel_tasks=1, retry_limit=0, rollout_timeout=0.3,
                                 cancel_grace=0.2, progress=False)
    episodes = await engine.execute_tasks([{"id": "hang"}, {"id": "a"}, {"id": "b"}])
    assert [e.termination_reason for e in episodes] == [TerminationReason.TIMEOUT, TerminationReason.FINISHED,
                                                        TerminationReason.FINISHED]
    assert engine._n_instances == 1


async def test_infrastructure_failure_is_retried_from_a_fresh_reset(serve) -> None:
    failed: set[str] = set()
    lock = threading.Lock()

    def script(body: dict[str, Any]) -> ScriptedReply:
        country = _country(_question(body))
        with lock:  # the first answer turn of each task fails with 503 once
            if any(m["role"] == "tool" for m in body["messages"]) and country not in failed:
                failed.add(country)
                return ScriptedReply(status=503, error="overloaded")
        return search_then_answer(body)

    server = serve(script)
    engine = make_engine(server, retry_limit=2)
    episodes = await engine.execute_tasks(TASKS[:2])
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.FINISHED and episode.is_correct
        assert episode.info["attempts"] == 2
        assert len(episode.trajectories[0].steps) == 2  # only the successful attempt's steps
    assert len(server.requests) == 2 * (2 + 2)


async def test_persistent_outage_is_recorded_and_not_scored(serve) -> None:
    server = serve(lambda body: ScriptedReply(status=503, error="down"))
    engine = make_engine(server, retry_limit=2, max_infra_failure_share=None)  # circuit breaker off
    (episode,) = await engine.execute_tasks(TASKS[:1])
    assert episode.termination_reason is TerminationReason.ENGINE_ERROR
    assert episode.info["attempts"] == 3 and len(server.requests) == 3
    assert "503" in episode.info["error"]
    assert (engine.stats.scored, engine.stats.infrastructure_failures, engine.stats.accuracy) == (0, 1, 0.0)


async def test_wrong_answer_is_never_retried(serve) -> None:
    server = serve(lambda body: search_then_answer(body, wrong=True))
    engine = make_engine(server, retry_limit=3)
    (episode,) = await engine.execute_tasks(TASKS[:1])
    assert episode.termination_reason is TerminationReason.FINISHED and not episode.is_correct
    assert episode.info["attempts"] == 1 and len(server.requests) == 2
    assert episode.info["reward"]["extracted"] == "Atlantis"
    assert (engine.stats.scored, engine.stats.accuracy) == (1, 0.0)


async def test_budget_exhaustion_is_typed_and_scored(serve) -> None:
    def always_search(body: dict[str, Any]) -> ScriptedReply:
        return ScriptedReply(tool_calls=[ScriptedToolCall("lookup", json.dumps({"key": "france"}))])

    server = serve(always_search)
    (episode,) = await make_engine(server).execute_tasks(TASKS[:1])
    assert episode.termination_reason is TerminationReason.MAX_TURNS
    assert episode.metrics["turns"] == 4 and not episode.is_correct
    assert episode.info["final_answer"] == "" and episode.info["attempts"] == 1


# ---------------------------------------------------------------- streaming, resume, Ctrl-C
async def test_resume_skips_finished_pairs(serve, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    first = serve(search_then_answer)
    await make_engine(first, output_path=out).execute_tasks(TASKS[:2], n_rollouts=2)
    lines = out.read_text().splitlines()
    kept = [Episode.model_validate_json(line) for line in lines[:2]]
    # an earlier outage for another pair (rerun on resume), then a line cut off by a crash
    outage = kept[0].model_copy(deep=True)
    outage.termination_reason = TerminationReason.ENGINE_ERROR
    outage.info.update(task_id="q-spain", rollout_index=0)
    out.write_text("\n".join(lines[:2]) + "\n" + outage.model_dump_json() + "\n" + lines[2][: len(lines[2]) // 2])

    second = serve(search_then_answer)
    episodes = await make_engine(second, output_path=out).execute_tasks(TASKS[:3], n_rollouts=2)
    done = {(e.info["task_id"], e.info["rollout_index"]) for e in kept}
    assert [e.id for e in episodes] == [f"{t['id']}:{r}" for t in TASKS[:3] for r in range(2)]
    assert all(e.is_correct for e in episodes)
    assert [episodes[[e.id for e in episodes].index(f"{k[0]}:{k[1]}")] for k in sorted(done)] == sorted(
        kept, key=lambda e: (e.info["task_id"], e.info["rollout_index"]))
    # only the 4 missing pairs ran, two requests each
    assert len(second.requests) == 2 * (6 - len(done))
    # a third run has nothing left to do
    third = serve(search_then_answer)
    again = await make_engine(third, output_path=out).execute_tasks(TASKS[:3], n_rollouts=2)
    assert third.requests == [] and [e.id for e in again] == [e.id for e in episodes]


async def test_cancellation_keeps_finished_episodes(serve, tmp_path: Path) -> None:
    def script(body: dict[str, Any]) -> ScriptedReply:
        reply = search_then_answer(body)
        reply.delay = 2.0 if _country(_question(body)) != "france" else 0.0
        return reply

    server = serve(script)
    out = tmp_path / "run.jsonl"
    run = asyncio.create_task(make_engine(server, output_path=out).execute_tasks(TASKS[:3]))
    for _ in range(200):
        await asyncio.sleep(0.05)
        if out.exists() and out.read_text().count("\n") == 1:
            break
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    (line,) = out.read_text().splitlines()
    assert Episode.model_validate_json(line).info["task_id"] == "q-france"


def test_summarize_reports_infrastructure_failures_and_errors_apart() -> None:
    episodes = [
        Episode(id="a", is_correct=True),
        Episode(id="b", is_correct=False),
        Episode(id="c", termination_reason=TerminationReason.TIMEOUT),
        Episode(id="d", termination_reason=TerminationReason.ERROR),
    ]
    stats = summarize(episodes)
    assert (stats.total, stats.scored, stats.correct, stats.infrastructure_failures, stats.errors) == (4, 2, 1, 1, 1)
    assert stats.accuracy == pytest.approx(1 / 2) and stats.failures == 2  # the error is not a wrong answer
