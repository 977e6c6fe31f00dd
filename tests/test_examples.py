"""The example scripts the manual names run as a user runs them, offline (scripted model, test index).

Each example is a short script over the library; here each runs in its own process, so an
example that no longer imports or starts fails here. (quickstart.py, quickstart_search.py via
scripts/quickstart.sh, eval_gaia.py, train_strands_agent.sh and retrieve_tool.py run in their own
test files.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag.testing import RetrievalServer, demo_index
from rllm.tracing.proxy import install_proxy_venv

pytestmark = [pytest.mark.slow, pytest.mark.verl]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "strands"


@pytest.fixture(scope="module")
def rag_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RetrievalServer(demo_index(tmp_path_factory.getbasetemp(), 200)) as server:
        yield server.base_url


def _run(script: str, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OTEL_SDK_DISABLED": "true", "COLUMNS": "250"}
    run = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    return run


def test_search_agent_eval_example_runs_scripted(rag_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _run("search_agent_strands.py", "--scripted", "--retrieval-url", rag_url, "--n", "3", "--output-dir",
               str(out), "--no-progress", cwd=tmp_path)
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"] == 3 and report["termination_reasons"] == {"finished": 3}
    assert "exact match" in run.stdout and "pass@1" in run.stdout


def test_traced_search_agent_example_captures_a_rollout(rag_url: str, tmp_path: Path) -> None:
    os.environ.setdefault("RLLM_PROXY_VENV", str(ROOT / ".cache" / "litellm-venv"))
    venv = install_proxy_venv()
    run = _run("traced_search_agent.py", "--retrieval-url", rag_url, "--venv", str(venv), "--run-dir",
               str(tmp_path / "run"), cwd=tmp_path)
    assert "calls captured in" in run.stdout and "call 1:" in run.stdout and "reward:" in run.stdout
    assert (tmp_path / "run" / "traces.db").is_file()


def test_train_example_prints_the_resolved_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fixtures.hotpotqa_rows import write_hotpotqa_rows

    monkeypatch.setenv("HOTPOTQA_DIR", str(write_hotpotqa_rows(tmp_path)))  # --dry-run tries the first row
    run = _run("train_strands_agent.py", "--dry-run", f"trainer.default_local_dir={tmp_path / 'run'}", cwd=ROOT)
    assert "StrandsAgentLoop" in run.stdout or "agent_loop" in run.stdout
