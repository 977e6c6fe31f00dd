"""The calculator demo (docs/quickstart.md) runs offline on its embedded default and writes a complete episode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rllm.types import Episode, TerminationReason

ROOT = Path(__file__).resolve().parents[3]


def test_quickstart_runs_on_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "episode.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples/strands/quickstart.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr

    episode = Episode.model_validate_json(out.read_text())
    steps = episode.trajectories[0].steps
    assert episode.termination_reason is TerminationReason.FINISHED
    assert [c.name for c in steps[0].tool_calls] == ["calculator"]
    assert steps[0].observation[0]["content"] == "395"
    assert steps[1].messages[-1] == {"role": "tool", "tool_call_id": steps[0].tool_calls[0].id, "content": "395"}
    assert "\\boxed{395}" in episode.info["final_answer"]
    assert "final answer: The result is \\boxed{395}." in run.stderr
