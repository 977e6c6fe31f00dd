"""Failures that stop an ``AgentWorkflowEngine`` run instead of hiding in it.

A bug repeated across rollouts stops the run with its cause after ``max_same_errors`` rollouts,
each of which still has its episode (with traceback) in the JSONL; a retrieval server refusing
the tool's token stops it with the 401 and the variable to set; too many infrastructure failures
trip the circuit breaker. Real Strands agents, a real retrieval server, scripted model servers.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag.client import make_local_search_tool
from rag.retriever import Retriever
from rag.server import ServerSettings
from rag.testing import RetrievalServer, demo_index
from rllm.engine.rollout import OpenAIEngine
from rllm.errors import InfrastructureFailureRateError, SystemicFailureError
from rllm.integrations.strands import Budget
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.rewards import RewardSearchFn
from rllm.types import Episode, TerminationReason
from rllm.workflows import StrandsWorkflow, Workflow
from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine, error_signature

pytestmark = pytest.mark.timeout(120)

TASKS = [{"id": f"t{i}", "question": f"Question {i}: who directed Krull?", "answer": "Peter Yates"}
         for i in range(8)]


def _read(path: Path) -> list[Episode]:
    return [Episode.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- a bug repeated across rollouts
class BuggyWorkflow(Workflow):
    """Odd tasks hit a ``TypeError`` (a bug); even ones finish. Counts runs still in flight."""

    active = 0
    started: list[str] = []
    fixed = False

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        type(self).active += 1
        type(self).started.append(uid)
        try:
            await asyncio.sleep(0.05)
            if int(task["id"][1:]) % 2 and not type(self).fixed:
                return task["id"] + 1  # TypeError: can only concatenate str (not "int") to str
            await asyncio.sleep(0.05)
            return Episode(id=uid, task=task, is_correct=True, reward=1.0)
        finally:
            type(self).active -= 1


async def test_the_same_bug_in_three_rollouts_stops_the_run_and_keeps_every_episode(tmp_path: Path, caplog) -> None:
    BuggyWorkflow.active, BuggyWorkflow.started, BuggyWorkflow.fixed = 0, [], False
    out = tmp_path / "run.jsonl"
    engine = AgentWorkflowEngine(BuggyWorkflow, {}, None, n_parallel_tasks=2, output_path=out, progress=False)

    with caplog.at_level("ERROR", logger="rllm.workflows.agent_workflow_engine"):
        with pytest.raises(SystemicFailureError) as info:
            await engine.execute_tasks(TASKS)

    error = info.value
    assert error.count == 3 and error.cause == 'TypeError: can only concatenate str (not "int") to str'
    assert "ended 3 rollouts" in str(error) and error.cause in str(error)
    assert error.episode_ids == ["t1:0", "t3:0", "t5:0"]
    # Stopped early: not every task ran, and nothing is left running.
    assert len(BuggyWorkflow.started) < len(TASKS) and BuggyWorkflow.active == 0
    # Nothing lost: every rollout that ended is in the JSONL, the errors with their traceback.
    written = {e.id: e for e in _read(out)}
    assert {"t1:0", "t3:0", "t5:0"} <= set(written)
    for uid in error.episode_ids:
        episode = written[uid]
        assert episode.termination_reason is TerminationReason.ERROR and episode.info["error"] == error.cause
        assert 'return task["id"] + 1' in episode.info["traceback"]
    assert all(written[uid].is_correct for uid in written if uid not in error.episode_ids)
    # The cause is printed with the traceback of its first rollout.
    assert "stopping the run after" in caplog.text and error.cause in caplog.text
    assert "traceback of t1:0" in caplog.text

    # Once fixed, a rerun on the same file redoes the errored pairs and keeps the others.
    BuggyWorkflow.fixed, BuggyWorkflow.started = True, []
    kept = {uid for uid, e in written.items() if e.termination_reason is TerminationReason.FINISHED}
    episodes = await AgentWorkflowEngine(BuggyWorkflow, {}, None, n_parallel_tasks=2, output_path=out,
                                         progress=False).execute_tasks(TASKS)
    assert all(e.is_correct for e in episodes)
    assert not kept & set(BuggyWorkflow.started) and {"t1:0", "t3:0", "t5:0"} <= set(BuggyWorkflow.started)


async def test_different_errors_and_a_higher_limit_do_not_stop_the_run() -> None:
    class Distinct(Workflow):
        async def run(self, task: dict[str, Any], uid: str) -> Episode:
            word = ["alpha", "beta", "gamma", "delta"][int(task["id"][1:])]
            raise RuntimeError(f"boom on {word}")  # a different message per task

    engine = AgentWorkflowEngine(Distinct, {}, None, progress=False)
    episodes = await engine.execute_tasks(TASKS[:4], n_rollouts=2)
    assert [e.termination_reason for e in episodes] == [TerminationReason.ERROR] * 8

    BuggyWorkflow.fixed = False
    engine = AgentWorkflowEngine(BuggyWorkflow, {}, None, progress=False, max_same_errors=None)
    episodes = await engine.execute_tasks(TASKS)
    assert sum(e.termination_reason is TerminationReason.ERROR for e in episodes) == 4


def test_error_signature_groups_the_same_bug_on_different_inputs() -> None:
    assert error_signature("KeyError: 'q-17'") == error_signature("KeyError: 'q-42'")
    assert error_signature("ValueError: 3 tokens at 0x7f3a2c") == error_signature("ValueError: 12 tokens at 0x1")
    assert error_signature("TypeError: a") != error_signature("ValueError: a")
    assert error_signature("RuntimeError: first line\nsecond line") == "RuntimeError: first line"


# ---------------------------------------------------------------- the retrieval tool's token
@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> Retriever:
    return Retriever.load(demo_index(tmp_path_factory.getbasetemp(), 200))


@pytest.fixture(scope="module")
def guarded_server(retriever: Retriever) -> Iterator[RetrievalServer]:
    with RetrievalServer(retriever, ServerSettings(token="s3cret")) as srv:
        yield srv


def search_then_answer(body: dict[str, Any]) -> ScriptedReply:
    """Search once, then answer whatever came back."""
    if not any(m["role"] == "tool" for m in body["messages"]):
        return ScriptedReply(tool_calls=[ScriptedToolCall("local_search", json.dumps({"query": "Krull director"}))])
    return ScriptedReply(content="\\boxed{Peter Yates}")


def search_engine(model_server: Any, retrieval_url: str, token: str | None, **kwargs: Any) -> AgentWorkflowEngine:
    rollout = OpenAIEngine(model="scripted", base_url=model_server.base_url, max_retries=0, timeout=60)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("retry_backoff", 0.0)
    return AgentWorkflowEngine(
        StrandsWorkflow,
        {"tools": lambda: [make_local_search_tool(retrieval_url, token, max_retries=0)],
         "system_prompt": "Search, then answer in \\boxed{}.", "reward_fn": RewardSearchFn(),
         "budget": Budget(max_model_turns=4)},
        rollout, **kwargs)


async def test_a_retrieval_token_the_server_refuses_stops_the_run_with_the_401(serve, guarded_server,
                                                                                tmp_path: Path) -> None:
    model = serve(search_then_answer)
    out = tmp_path / "run.jsonl"
    with pytest.raises(SystemicFailureError) as info:
        await search_engine(model, guarded_server.base_url, None, n_parallel_tasks=2, output_path=out,
                            retry_limit=3).execute_tasks(TASKS)
    cause = info.value.cause
    assert cause.startswith("RetrievalAuthError: ") and "HTTP 401" in cause and "set RETRIEVAL_TOKEN" in cause
    assert "HTTP 401" in str(info.value) and "RETRIEVAL_TOKEN" in str(info.value)
    written = _read(out)
    assert len(written) >= 3
    for episode in written:
        # Not the policy's mistake: an unscored error, not a wrong answer, never retried.
        assert episode.termination_reason is TerminationReason.ERROR and episode.reward == 0.0
        assert episode.info["attempts"] == 1 and "RetrievalAuthError" in episode.info["traceback"]
        # The tool round is recorded: the model was shown the refusal as an error tool result.
        (step,) = episode.trajectories[0].steps
        assert "HTTP 401" in json.dumps(step.observation)
    # No model call was spent after a refused search (a cancelled rollout may have made its first one).
    assert all(not any(m["role"] == "tool" for m in body["messages"]) for body in model.requests)

    # With the token the same run answers.
    model = serve(search_then_answer)
    episodes = await search_engine(model, guarded_server.base_url, "s3cret").execute_tasks(TASKS[:2])
    assert all(e.termination_reason is TerminationReason.FINISHED and e.is_correct for e in episodes)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_a_dead_retrieval_server_is_infrastructure_retried_then_trips_the_circuit_breaker(serve) -> None:
    dead = _dead_url()
    # Breaker off: every rollout is recorded as a tool-backend failure after its retries, unscored.
    model = serve(search_then_answer)
    engine = search_engine(model, dead, None, retry_limit=1, max_infra_failure_share=None)
    episodes = await engine.execute_tasks(TASKS[:2])
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.TOOL_BACKEND_ERROR
        assert episode.info["attempts"] == 2 and not episode.is_correct
        assert episode.info["error"].startswith("tool 'local_search' failed: RetrievalUnavailableError: ")
        assert "unreachable" in episode.info["error"]
    assert engine.stats.infrastructure_failures == 2 and engine.stats.scored == 0
    assert len(model.requests) == 4  # one model call per attempt: nothing spent after the dead search

    # Breaker on (default 50%): the run stops with the most common cause.
    model = serve(search_then_answer)
    with pytest.raises(InfrastructureFailureRateError) as info:
        await search_engine(model, dead, None, retry_limit=0, n_parallel_tasks=1).execute_tasks(TASKS)
    error = info.value
    assert error.failures == 5 and error.total == 8 and error.cause_count == 5 and error.share == 5 / 8
    assert error.cause.startswith("tool 'local_search' failed: RetrievalUnavailableError")
    assert "5 of 8 rollouts failed on infrastructure (more than 50%)" in str(error)


class FlakyWorkflow(Workflow):
    """Tasks named ``down*`` end as engine failures; the rest finish."""

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        await asyncio.sleep(0.01)
        if task["id"].startswith("down"):
            return Episode(id=uid, task=task, termination_reason=TerminationReason.ENGINE_ERROR,
                           info={"error": "EngineUnavailableError: http://gpu-3:8000 failed after 4 attempts"})
        return Episode(id=uid, task=task, is_correct=True)


async def test_circuit_breaker_trips_only_past_the_share(tmp_path: Path) -> None:
    tasks = [{"id": f"ok{i}"} for i in range(5)] + [{"id": f"down{i}"} for i in range(5)]
    # 5 of 10 is not more than 50%: the run completes and reports them apart.
    engine = AgentWorkflowEngine(FlakyWorkflow, {}, None, retry_limit=0, progress=False)
    episodes = await engine.execute_tasks(tasks)
    assert engine.stats.infrastructure_failures == 5 and len(episodes) == 10

    out = tmp_path / "run.jsonl"
    engine = AgentWorkflowEngine(FlakyWorkflow, {}, None, retry_limit=0, progress=False, output_path=out,
                                 max_infra_failure_share=0.3, n_parallel_tasks=1)
    with pytest.raises(InfrastructureFailureRateError, match="http://gpu-3:8000") as info:
        await engine.execute_tasks(tasks[::-1])  # the failures first: 4 of 10 is certain to exceed 30%
    assert (info.value.failures, info.value.total) == (4, 10)
    assert [e.id for e in _read(out)] == ["down4:0", "down3:0", "down2:0", "down1:0"]
