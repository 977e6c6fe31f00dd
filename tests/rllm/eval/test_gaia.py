"""The GAIA eval (``rllm.eval.gaia``, run as examples/strands/eval_gaia.py) end to end on the shipped demo tasks.

The model is a real OpenAI-compatible server on 127.0.0.1 answering from a script (or a tiny
local model run in process); the agent a real Strands loop run through AgentWorkflowEngine with
the real GAIA tools in per-task work dirs. The scripted policy (see ``scripted_gaia_policy``) gets
levels 1, 2 and 3 right on 2 of 3, 2 of 2 and 1 of 3 demo tasks.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rllm.data.gaia import GAIA_DEMO_DIR
from rllm.offline.scripted_server import ScriptedReply, ToyChatTokens
from rllm.tools.python_exec import sandbox_problem
from rllm.types import Episode, TerminationReason

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "strands" / "eval_gaia.py"
DEMO = GAIA_DEMO_DIR
CSV_TASK = "3f1c2a9e-0b7d-4c55-9a1e-6d2f8b1c0a11"
ATHENS_TASK = "9b8a7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c03"
# The eval refuses to start without an OS sandbox; where bwrap cannot run, these tests opt out of it.
SANDBOX_FLAGS = [] if sandbox_problem() is None else ["--unsafe-python-exec"]
ISOLATION = "bubblewrap sandbox" if not SANDBOX_FLAGS else "audit-hook guard only"


@pytest.fixture(scope="module")
def eval_gaia() -> ModuleType:
    import rllm.eval.gaia

    return rllm.eval.gaia


def _levels(report: dict[str, Any]) -> dict[str, tuple[int, int, int, float | None]]:
    rows = {**report["levels"], "overall": report["overall"]}
    return {k: (r["scored"], r["correct"], r["infrastructure_failures"], r["accuracy"]) for k, r in rows.items()}


def _episodes(out: Path) -> list[Episode]:
    return [Episode.model_validate_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_scripted_eval_writes_report_summary_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, str(SCRIPT), "--scripted", "--out", str(out), "--n-parallel", "3", "--no-progress",
               *SANDBOX_FLAGS]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr

    assert f"python_exec isolation: {ISOLATION}" in run.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["python_isolation"].startswith(ISOLATION)
    assert _levels(report) == {"1": (3, 2, 0, 2 / 3), "2": (2, 2, 0, 1.0), "3": (3, 1, 0, 1 / 3),
                               "overall": (8, 5, 0, 5 / 8)}
    answers = {row["task_id"]: (row["model_answer"], row["correct"]) for row in report["tasks"]}
    assert answers[CSV_TASK] == ("117", True)
    assert answers["8a4e6b20-5c3d-4f1a-b7e2-1d9c0f3a5b22"] == ("Ana; Ben; Zoe", True)  # list rule: ; and , both split
    assert answers["e2b58f47-9d1c-4a3e-a6f5-0c8e7b4d9d44"] == ("$1,250", True)  # number rule: $ and , stripped
    assert answers[ATHENS_TASK] == ("unknown", False)
    assert report["termination_reasons"] == {"finished": 8} and report["infrastructure_failures"] == []

    summary = (out / "summary.txt").read_text()
    assert "GAIA validation — scripted" in summary
    for line in ("│ Level 1 │     3 │      3 │       2 │    66.7% │",
                 "│ Level 3 │     3 │      3 │       1 │    33.3% │",
                 "│ Overall │     8 │      8 │       5 │    62.5% │"):
        assert line in summary and line in run.stdout

    png = (out / "accuracy.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    submission = [json.loads(line) for line in (out / "submission.jsonl").read_text().splitlines()]
    assert [row["task_id"] for row in submission] == [row["task_id"] for row in report["tasks"]]
    assert submission[1]["model_answer"] == "117"

    # The attachment was copied into the task's work dir and read through the file tool.
    episodes = {e.info["task_id"]: e for e in _episodes(out)}
    assert len(episodes) == 8
    csv_episode = episodes[CSV_TASK]
    work_dir = Path(csv_episode.info["work_dir"])
    assert (work_dir / f"{CSV_TASK}.csv").read_text() == (DEMO / f"2023/validation/{CSV_TASK}.csv").read_text()
    first_step = csv_episode.trajectories[0].steps[0]
    assert str(work_dir / f"{CSV_TASK}.csv") in json.dumps(first_step.messages)
    assert [(c.name, c.input) for c in first_step.tool_calls] == [("file_read", {"path": f"{CSV_TASK}.csv"})]
    assert first_step.observation[0]["content"].endswith("Mar | 19 | 26 | 45\nTOTAL | 40 | 77 | 117")
    python_steps = episodes["c7d91e35-2a6f-4b08-8e4c-9f0b3d2e6c33"].trajectories[0].steps
    assert [c.name for s in python_steps for c in s.tool_calls] == ["file_read", "python_exec"]
    assert python_steps[1].observation[0]["content"] == "exit code 0\n--- stdout ---\n55"

    # A rerun with the same output resumes: nothing is run again, the report is the same.
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "8 of 8 rollouts already done" in rerun.stderr
    assert len(_episodes(out)) == 8
    assert _levels(json.loads((out / "report.json").read_text())) == _levels(report)


def test_infrastructure_failures_are_reported_apart_not_as_wrong(
    tmp_path: Path, serve: Any, eval_gaia: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def script(body: dict[str, Any]) -> ScriptedReply:
        if "Olympic" in json.dumps(body["messages"]):
            return ScriptedReply(status=503, error="model overloaded")
        return eval_gaia.scripted_gaia_policy(body)

    server = serve(script)
    out = tmp_path / "run"
    status = eval_gaia.main(["--base-url", server.base_url, "--model", "scripted", "--data-dir", str(DEMO),
                             "--out", str(out), "--max-retries", "0", "--retry-limit", "1", "--no-progress",
                             "--no-http", "--n-parallel", "4", *SANDBOX_FLAGS])
    assert status == 0
    report = json.loads((out / "report.json").read_text())
    # Level 3: the failed task is neither scored nor wrong; accuracy is 1 of the 2 scored tasks.
    assert _levels(report)["3"] == (2, 1, 1, 0.5)
    assert _levels(report)["overall"] == (7, 5, 1, 5 / 7)
    (failure,) = report["infrastructure_failures"]
    assert (failure["task_id"], failure["level"], failure["reason"]) == (ATHENS_TASK, 3, "engine_error")
    assert "503" in failure["error"]
    olympic_requests = [b for b in server.requests if "Olympic" in json.dumps(b["messages"])]
    assert len(olympic_requests) == 2  # the first attempt and one rerun, no more
    row = next(r for r in report["tasks"] if r["task_id"] == ATHENS_TASK)
    assert (row["correct"], row["termination_reason"]) == (None, TerminationReason.ENGINE_ERROR.value)
    printed = capsys.readouterr().out
    assert "1 task(s) failed for infrastructure reasons" in printed and ATHENS_TASK in printed
    assert "│ Level 3 │     3 │      2 │       1 │    50.0% │              1 │" in (out / "summary.txt").read_text()
    assert {t.get("function", {}).get("name") for b in server.requests for t in b.get("tools", [])} == {
        "calculator", "file_read", "python_exec"}


def test_hidden_test_answers_are_unscored(tmp_path: Path, eval_gaia: ModuleType) -> None:
    out = tmp_path / "run"
    assert eval_gaia.main(["--scripted", "--split", "test", "--out", str(out), "--no-progress", *SANDBOX_FLAGS]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["overall"] == {"tasks": 1, "scored": 0, "correct": 0, "infrastructure_failures": 0,
                                 "unscored": 1, "accuracy": None}
    assert "│ Overall │     1 │      0 │       0 │        - │" in (out / "summary.txt").read_text()


def test_bad_inputs_fail_with_a_message(
    tmp_path: Path, eval_gaia: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert eval_gaia.main(["--scripted", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "error: no GAIA metadata in" in capsys.readouterr().out
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status = eval_gaia.main(["--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--data-dir", str(DEMO),
                             "--out", str(tmp_path / "o"), *SANDBOX_FLAGS])
    assert status == 2
    assert f"error: model endpoint (--base-url) at http://127.0.0.1:{port}/v1 is unreachable" in \
        capsys.readouterr().out.replace("\n", " ")
    with pytest.raises(SystemExit):
        eval_gaia.main(["--data-dir", str(DEMO)])  # GAIA has no default model: one must be named
    assert "name the model: --model PATH_OR_HUB_NAME (run locally), --base-url URL --model NAME" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_gaia.main(["--model", "m"])
    assert f"pass --data-dir DIR (download GAIA there with scripts/prepare_gaia.py), or --data-dir {DEMO}" in \
        capsys.readouterr().err.replace("\n", " ")


def test_eval_refuses_to_start_without_a_sandbox_unless_told(
    tmp_path: Path, eval_gaia: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    out = tmp_path / "run"
    assert eval_gaia.main(["--scripted", "--split", "test", "--out", str(out), "--no-progress"]) == 2
    printed = capsys.readouterr().out
    assert "python_exec needs an OS sandbox" in printed and "No permissions to create new namespace" in printed
    assert "apt-get install bubblewrap" in printed and "--unsafe-python-exec" in printed
    assert not out.exists()  # nothing ran

    assert eval_gaia.main(["--scripted", "--split", "test", "--out", str(out), "--no-progress",
                           "--unsafe-python-exec"]) == 0
    assert "python_exec isolation: audit-hook guard only (UNSAFE" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["python_isolation"].startswith("audit-hook guard only")


# --------------------------------------------------------------------------- the model options shared with the search eval
def test_a_local_model_runs_in_process(tmp_path: Path, eval_gaia: ModuleType) -> None:
    from rllm.offline.tiny_models import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "run"
    assert eval_gaia.main(["--model", str(model_dir), "--data-dir", str(DEMO), "--limit", "2", "--max-tokens", "16",
                           "--max-turns", "2", "--device", "cpu", "--out", str(out), "--no-progress",
                           *SANDBOX_FLAGS]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["model"], report["model_kind"], report["base_url"]) == (str(model_dir), "local", None)
    assert report["engine"] == f"{model_dir} (transformers, cpu)"
    assert report["overall"]["tasks"] == 2 and report["infrastructure_failures"] == []
    for episode in _episodes(out):  # token-in/token-out: what the policy sampled, with its loss mask
        trace = episode.trajectories[0].token_trace
        assert trace is not None and sum(trace.loss_mask) > 0


def test_vllm_token_mode_records_the_token_ids_the_endpoint_returns(
    tmp_path: Path, serve: Any, eval_gaia: ModuleType
) -> None:
    server = serve(ToyChatTokens.wrap(eval_gaia.scripted_gaia_policy))
    out = tmp_path / "run"
    assert eval_gaia.main(["--base-url", server.base_url, "--model", "scripted", "--vllm", "--data-dir", str(DEMO),
                           "--limit", "2", "--out", str(out), "--no-progress", "--no-http", *SANDBOX_FLAGS]) == 0
    assert server.requests and all(body.get("return_token_ids") is True for body in server.requests)
    steps = [step for episode in _episodes(out) for step in episode.trajectories[0].steps]
    assert steps and all(step.model_output.completion_ids == ToyChatTokens.completion_ids(
        eval_gaia.scripted_gaia_policy({"messages": step.messages, "tools": step.tools})) for step in steps)
    assert json.loads((out / "report.json").read_text())["engine"].endswith("(vLLM token ids)")


def test_the_endpoint_key_comes_from_OPENAI_API_KEY_and_a_typed_one_warns(
    tmp_path: Path, eval_gaia: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fixtures.keyed_server import KeyedOpenAIServer

    with pytest.raises(SystemExit):
        eval_gaia.main(["--help"])
    assert "$OPENAI_API_KEY" in capsys.readouterr().out
    key = "sk-endpoint-secret"
    with KeyedOpenAIServer(key, "FINAL ANSWER: 6176") as server:
        argv = ["--base-url", server.base_url, "--model", "keyed", "--data-dir", str(DEMO), "--limit", "1",
                "--no-progress", "--no-http", "--max-retries", "0", *SANDBOX_FLAGS]
        monkeypatch.setenv("OPENAI_API_KEY", key)
        with caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
            assert eval_gaia.main([*argv, "--out", str(tmp_path / "env")]) == 0
        assert not caplog.records
        monkeypatch.delenv("OPENAI_API_KEY")
        with caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
            assert eval_gaia.main([*argv, "--api-key", key, "--out", str(tmp_path / "typed")]) == 0
    (warning,) = caplog.records
    assert warning.getMessage() == ("--api-key on the command line is visible to every user of this machine (ps); "
                                    "set OPENAI_API_KEY in the environment instead")
    assert set(server.authorizations) == {f"Bearer {key}"}  # the endpoint check and every model call
    for run in ("env", "typed"):
        report = json.loads((tmp_path / run / "report.json").read_text())
        assert report["overall"]["correct"] == 1  # the answer came through, so the key did
        assert key not in json.dumps(report)


# --------------------------------------------------------------------------- a normal install
def test_the_offline_demo_runs_from_a_normal_install(tmp_path: Path) -> None:
    """A wheel built from pyproject.toml carries the demo tasks, and the demo runs from the installed package."""
    import shutil

    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("rllm", "rag"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                    str(source)], check=True, cwd=tmp_path, timeout=240)
    (wheel,) = (tmp_path / "dist").glob("rllm-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--no-compile", "--target", str(site), str(wheel)], check=True,
                   timeout=240)
    demo = site / "rllm" / "data" / "gaia_demo"
    assert sorted(p.relative_to(demo).as_posix() for p in demo.rglob("*") if p.is_file()) == sorted(
        p.relative_to(DEMO).as_posix() for p in DEMO.rglob("*") if p.is_file() and "__pycache__" not in p.parts)

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(site), "OTEL_SDK_DISABLED": "true"}
    run = subprocess.run([sys.executable, "-m", "rllm.eval.gaia", "--scripted", "--limit", "2", "--out", str(out),
                          "--no-progress", *SANDBOX_FLAGS], capture_output=True, text=True, timeout=240,
                         cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["data_dir"] == str(demo.resolve())  # the installed package's copy, not the clone's
    assert report["overall"]["correct"] == 2
    csv_episode = {e.info["task_id"]: e for e in _episodes(out)}[CSV_TASK]  # episodes are written as they finish
    assert Path(csv_episode.info["work_dir"], f"{CSV_TASK}.csv").read_text().endswith("TOTAL,40,77,117\n")
