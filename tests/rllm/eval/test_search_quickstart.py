"""The search-agent evaluation one flag away: ``bash scripts/quickstart.sh --search``, the HotpotQA search agent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rag.testing import RetrievalServer, demo_index
from rllm.offline.qwen_tokenizer import cache_root
from rllm.offline.tiny_models import build_tiny_model_dir
from rllm.types import Episode

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
INDEX_SIZE = 200


def _env(**extra: str) -> dict[str, str]:
    # A wide terminal keeps rich from wrapping paths; PYTHON keeps the script on this interpreter.
    return {**os.environ, "PYTHON": sys.executable, "COLUMNS": "250", "OTEL_SDK_DISABLED": "true", **extra}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_index(tmp_path_factory.getbasetemp(), INDEX_SIZE)


def test_quickstart_with_a_tiny_local_model(index_dir: Path, tmp_path: Path) -> None:
    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "out"
    started = time.perf_counter()
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/quickstart.sh"), "--search", "--model", str(model_dir), "--n", "2", "--max-tokens", "16",
         "--index-dir", str(index_dir), "--output-dir", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    )
    elapsed = time.perf_counter() - started
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert re.search(r"accuracy \(exact match\): 0/2 = 0\.000", run.stdout), run.stdout
    assert "sample trajectory" in run.stdout and "termination:" in run.stdout
    assert f"episodes written to {out / 'episodes.jsonl'}" in run.stdout
    episodes = [Episode.model_validate_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(e.trajectories[0].token_trace is not None for e in episodes)
    # the embedded retrieval server was started for the run and is stopped after it
    url = re.search(r"passages at (http://127\.0\.0\.1:\d+)", run.stdout).group(1)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
    assert (out / "rag_server.log").is_file()
    print(f"quickstart with a tiny model took {elapsed:.1f}s")


def _no_hub_env(tmp_path: Path) -> dict[str, str]:
    # An empty model cache and a hub endpoint that refuses connections: no hub model can be had.
    # rllm's own build cache stays where it is, so the real Qwen tokenizer is not rebuilt.
    return _env(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", RLLM_CACHE_DIR=str(cache_root()))


def test_quickstart_without_the_hub_runs_a_random_weight_qwen3(index_dir: Path, tmp_path: Path) -> None:
    # The search evaluation on a machine without hub access: one line says so, then the same
    # pipeline runs on a small random-weight Qwen3 with the real Qwen tokenizer and chat template.
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/quickstart.sh"), "--search", "--n", "2", "--max-tokens", "16", "--index-dir", str(index_dir),
         "--output-dir", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_no_hub_env(tmp_path),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert "Qwen/Qwen3-0.6B cannot be fetched: the Hugging Face hub cannot be reached" in run.stdout
    assert "random-weight Qwen3 (plumbing only: random weights, real Qwen tokenizer and chat template)" in run.stdout
    assert "(plumbing with random weights: the scores mean nothing)" in run.stdout
    episodes = [Episode.model_validate_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2
    trace = episodes[0].trajectories[0].token_trace
    assert trace is not None and trace.token_ids[:3] == [151644, 8948, 198]  # <|im_start|>system\n, Qwen's real ids


def test_quickstart_with_an_unreachable_hub_model_says_how_to_pass_a_model(tmp_path: Path) -> None:
    # A hub model named explicitly is not replaced: the run stops, saying why and what to pass instead.
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/quickstart.sh"), "--search", "--model", "Qwen/Qwen3-0.6B", "--output-dir",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_no_hub_env(tmp_path),
    )
    assert run.returncode == 2
    message = run.stdout + run.stderr
    assert "Traceback" not in message
    assert "Qwen/Qwen3-0.6B could not be fetched: the Hugging Face hub cannot be reached" in message
    assert "--model PATH" in message and "--base-url URL" in message
    assert not (tmp_path / "out" / "rag_server.log").exists()  # it stops before starting anything


def _load_quickstart():
    import rllm.eval.search_quickstart

    return rllm.eval.search_quickstart


@pytest.fixture(scope="module")
def rag_url(index_dir: Path) -> Iterator[str]:
    with RetrievalServer(index_dir) as server:
        yield server.base_url


def test_quickstart_scripted_prints_accuracy_and_a_trajectory(rag_url: str, tmp_path: Path, capsys) -> None:
    quickstart = _load_quickstart()
    code = quickstart.main(["--scripted", "--retrieval-url", rag_url, "--n", "12", "--output-dir", str(tmp_path),
                            "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    episodes = [Episode.model_validate_json(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    correct = sum(e.is_correct for e in episodes)
    assert correct >= 2  # the copy-a-title baseline gets questions 7 and 11 right
    assert f"accuracy (exact match): {correct}/12 = {correct / 12:.3f}" in printed
    assert "turn 1: local_search(" in printed and "=> finished" in printed and "correct (reward 1)" in printed
    assert "termination: finished 12" in printed
    # a second run starts afresh, unless told to resume
    assert quickstart.main(["--scripted", "--retrieval-url", rag_url, "--n", "2", "--output-dir", str(tmp_path),
                            "--no-progress"]) == 0
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 2
