"""The HotpotQA search agent and its eval CLI, end to end on the shipped sample.

Real parts: the retrieval server over HTTP (FAISS + MiniLM over the shipped HotpotQA paragraphs),
the Strands agent loop, the ``local_search`` tool, AgentWorkflowEngine, the reward. The model is
the scripted policy over real HTTP, or ``TransformersEngine`` on a tiny random Qwen3.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag.testing import RetrievalServer, demo_index
from rllm.agents.search import (
    SEARCH_SYSTEM_PROMPT,
    format_question,
    scripted_search_reply,
    search_tools,
    search_workflow_args,
)
from rllm.data.hotpotqa import load_hotpotqa
from rllm.eval import reports
from rllm.eval import search as cli
from rllm.offline.tiny_models import build_tiny_model_dir
from rllm.rewards import RewardSearchFn
from rllm.types import Episode, TerminationReason
from rllm.workflows import StrandsWorkflow

ROOT = Path(__file__).resolve().parents[3]
INDEX_SIZE = 200  # the paragraphs of the first ~20 questions




@pytest.fixture(scope="module")
def rag_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RetrievalServer(demo_index(tmp_path_factory.getbasetemp(), INDEX_SIZE)) as server:
        yield server.base_url


def _episodes(path: Path) -> list[Episode]:
    return [Episode.model_validate_json(line) for line in path.read_text().splitlines()]


def test_agent_parts_follow_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "\\boxed{}" in SEARCH_SYSTEM_PROMPT and "local_search" in SEARCH_SYSTEM_PROMPT
    assert format_question({"question": "  Who? \n"}) == "Who?"
    with pytest.raises(KeyError):
        format_question({"id": "x"})
    (tool,) = search_tools("http://127.0.0.1:9999", timeout=3.0)
    assert tool.tool_name == "local_search"
    assert set(tool.tool_spec["inputSchema"]["json"]["properties"]) == {"query", "top_k"}
    assert tool.client.base_url == "http://127.0.0.1:9999" and tool.client.timeout == 3.0
    monkeypatch.setenv("RETRIEVAL_SERVER_URL", "http://127.0.0.1:7777")
    args = search_workflow_args(partial_credit=True)
    assert args["tools"][0].client.base_url == "http://127.0.0.1:7777"
    assert args["reward_fn"].partial_credit and args["task_to_prompt"] is format_question
    StrandsWorkflow(None, **args)  # the arguments are exactly what the workflow takes


def test_scripted_eval_end_to_end_on_real_retrieval(rag_url: str, tmp_path: Path, capsys) -> None:
    n, rollouts = 8, 2
    code = cli.main(["--scripted", "--retrieval-url", rag_url, "--n", str(n), "--rollouts", str(rollouts),
                     "--output-dir", str(tmp_path), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    tasks = load_hotpotqa(limit=n)
    episodes = _episodes(tmp_path / "episodes.jsonl")
    assert len(episodes) == n * rollouts
    assert {(e.info["task_id"], e.info["rollout_index"]) for e in episodes} == {
        (t["id"], r) for t in tasks for r in range(rollouts)}
    found_supporting = 0
    for episode in episodes:
        steps = episode.trajectories[0].steps
        assert episode.termination_reason is TerminationReason.FINISHED
        assert [len(s.tool_calls) for s in steps] == [1, 0]
        assert steps[0].tool_calls[0].name == "local_search"
        passages = steps[0].observation[0]["content"]
        assert passages.startswith("[1] ")  # real passages from the server, numbered with titles
        titles = {title for title, _ in episode.task["supporting_facts"]}
        found_supporting += any(f"] {title}\n" in passages for title in titles)
        # the score is the reward of the boxed answer, against the task's own answer
        expected = RewardSearchFn()(episode.task, episode.info["final_answer"])
        assert (episode.is_correct, episode.reward) == (expected.is_correct, expected.reward)
        assert episode.info["reward"]["extracted"] == expected.metadata["extracted"]
    assert found_supporting >= len(episodes) * 3 // 4  # MiniLM finds a supporting paragraph for most questions

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["episodes"] == n * rollouts and report["tasks"] == n
    assert report["exact_match"] == pytest.approx(sum(e.is_correct for e in episodes) / len(episodes))
    assert report["pass@1"] == pytest.approx(report["exact_match"])  # a deterministic policy
    assert report["pass@2"] == pytest.approx(report["exact_match"])
    assert report["mean_turns"] == 2.0 and report["mean_tool_calls"] == 1.0
    assert report["termination_reasons"] == {"finished": n * rollouts}
    for label in ("exact match", "F1", "pass@2", "mean turns", "mean tool calls", "termination reasons", "finished"):
        assert label in printed


def test_transformers_engine_on_a_tiny_local_model(rag_url: str, tmp_path: Path) -> None:
    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    code = cli.main(["--model", str(model_dir), "--retrieval-url", rag_url, "--n", "2", "--max-tokens", "16",
                     "--output-dir", str(tmp_path / "out"), "--no-progress", "--parallel", "2"])
    assert code == 0
    episodes = _episodes(tmp_path / "out" / "episodes.jsonl")
    assert len(episodes) == 2
    for episode in episodes:
        assert not episode.termination_reason.is_infrastructure_failure
        trajectory = episode.trajectories[0]
        assert trajectory.steps, episode.info
        trace = trajectory.token_trace
        assert trace is not None  # a token engine leaves the exact token sequence
        first = trajectory.steps[0].model_output
        assert 0 < len(first.completion_ids) <= 16 and len(first.logprobs) == len(first.completion_ids)
        assert trace.token_ids[: len(first.prompt_ids)] == first.prompt_ids
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["tasks"] == 2 and report["scored"] == 2


def test_pass_at_k_and_report_leave_infrastructure_failures_out() -> None:
    assert reports.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert reports.pass_at_k(4, 0, 4) == 0.0 and reports.pass_at_k(4, 1, 4) == 1.0
    task = {"question": "q", "answer": "a"}

    def ep(task_id: str, index: int, correct: bool, reason=TerminationReason.FINISHED, f1=0.0) -> Episode:
        return Episode(id=f"{task_id}:{index}", task=task, is_correct=correct, termination_reason=reason,
                       metrics={"turns": 2.0, "tool_calls": 1.0}, info={"task_id": task_id, "reward": {"f1": f1}})

    episodes = [ep("a", 0, True, f1=1.0), ep("a", 1, False, f1=0.5), ep("b", 0, False),
                ep("b", 1, False, TerminationReason.ENGINE_ERROR), ep("c", 0, False, TerminationReason.MAX_TURNS)]
    report = reports.search_report(episodes)
    assert report["scored"] == 4 and report["infrastructure_failures"] == 1
    assert report["exact_match"] == pytest.approx(1 / 4) and report["f1"] == pytest.approx(1.5 / 4)
    assert report["pass@1"] == pytest.approx((0.5 + 0 + 0) / 3)
    assert report["pass@2"] == pytest.approx(1.0)  # only task a has two scored rollouts
    assert report["termination_reasons"] == {"finished": 3, "engine_error": 1, "max_turns": 1}

    # A bug (an error episode) is counted apart, not scored as the policy's wrong answer.
    with_bug = reports.search_report([*episodes, ep("c", 1, False, TerminationReason.ERROR)])
    assert with_bug["errors"] == 1 and with_bug["scored"] == 4 and with_bug["exact_match"] == pytest.approx(1 / 4)


def test_scripted_policy_searches_then_answers_from_titles() -> None:
    first = scripted_search_reply({"messages": [{"role": "system", "content": "s"},
                                                {"role": "user", "content": "Who directed Krull?"}]})
    assert json.loads(first.tool_calls[0].arguments) == {"query": "Who directed Krull?", "top_k": 3}
    passages = "[1] Krull (film)\nKrull is a 1983 film.\n\n[2] Peter Yates\nPeter Yates was a director."
    second = scripted_search_reply({"messages": [{"role": "user", "content": "Who directed Krull?"},
                                                 {"role": "tool", "tool_call_id": "c", "content": passages}]})
    assert second.content.endswith("\\boxed{Peter Yates}.")
    yes = scripted_search_reply({"messages": [{"role": "user", "content": "Are both bands from Ohio?"},
                                              {"role": "tool", "tool_call_id": "c", "content": passages}]})
    assert "\\boxed{yes}" in yes.content


def test_an_eval_whose_engine_is_unreachable_stops_before_any_rollout_with_exit_2(rag_url: str, tmp_path: Path,
                                                                                  capsys) -> None:
    from rllm.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    started = time.perf_counter()
    code = cli.main(["--base-url", dead, "--model", "m", "--retrieval-url", rag_url, "--n", "4",
                     "--output-dir", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 2 and time.perf_counter() - started < 15
    assert "model endpoint (--base-url)" in printed and "unreachable" in printed and dead in printed
    assert not (tmp_path / "episodes.jsonl").exists() or not _episodes(tmp_path / "episodes.jsonl")


def test_an_unreachable_retrieval_url_stops_before_any_rollout(tmp_path: Path, capsys) -> None:
    from rllm.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["--scripted", "--retrieval-url", dead, "--n", "2", "--output-dir", str(tmp_path), "--no-progress"])
    assert code == 2 and "retrieval server (--retrieval-url)" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--base-url", "--retrieval-url"])
def test_a_url_without_a_scheme_is_refused_up_front(option: str, capsys) -> None:
    argv = ["--base-url", "127.0.0.1:9/v1", "--model", "m"] if option == "--base-url" else \
        ["--scripted", "--retrieval-url", "127.0.0.1:8000"]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"{option}: '127.0.0.1" in error and "http:// or https://" in error
