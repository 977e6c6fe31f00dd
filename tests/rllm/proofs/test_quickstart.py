"""The main job (docs/quickstart.md): ``bash scripts/quickstart.sh`` trains a Strands agent through verl's own trainer.

The run test is the quickstart's whole path on a tiny configuration: a few warm-start steps, two
RLOO steps of verl's v1 trainer on the CPU (embedded rollout backend, ``StrandsAgentLoop``, the
guards), validation before and after, verl's saved policy evaluated with ``AgentWorkflowEngine``.
It asserts what a user reads and gets, not that two steps learn (they cannot, and the run says so);
the full run's learning is in docs/benchmarks.md ("Quickstart").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.types import Episode  # noqa: E402

pytestmark = pytest.mark.slow(verl_runs=1)

ROOT = Path(__file__).resolve().parents[3]
TINY = {"hidden_size": 64, "num_layers": 2, "world_size": 120, "held_out": 4, "eval_samples": 1, "demonstrations": 16,
        "warm_steps": 4, "warm_batch": 8, "prompts_per_step": 2, "rollouts_per_prompt": 2, "micro_batch_size": 4,
        "response_length": 64}
# Four warm-start steps leave the model nearly random: it writes to the end of every response, which the
# truncation guard would (rightly) stop, and its reward is 0 everywhere, which the end of the run would (rightly)
# fail as "no learning signal"; the full quickstart's warm start ends its turns and its reward varies.
PLUMBING_ONLY = ["--verl-override", "rllm.guards.max_truncated_share=null",
                 "--verl-override", "rllm.guards.max_steps_without_signal=null"]


@pytest.mark.timeout(900)
def test_the_quickstart_trains_through_verls_trainer_and_evaluates_the_trained_policy(tmp_path, capsys) -> None:
    for module in ("verl", "ray", "transfer_queue"):  # the train extra; the dev extra installs it
        pytest.importorskip(module, reason=f"{module} is not installed: the quickstart needs the train extra")
    from transformers import AutoModelForCausalLM

    from rllm.proofs import quickstart

    code = quickstart.main(["--out", str(tmp_path), "--device", "cpu", "--rl-steps", "2", "--eval-every", "1",
                            "--no-progress", *PLUMBING_ONLY], **TINY)

    printed = capsys.readouterr()
    log = (tmp_path / "verl.log").read_text(encoding="utf-8", errors="replace")
    # Two steps cannot learn: exit status 1, and the run says why (not that verl failed).
    assert code == 1, printed.out + printed.err + log[-3000:]
    assert "FAILED: held-out reward" in printed.err and "verl's trainer exited" not in printed.err
    # verl's own trainer ran, with the guarded task runner and the embedded backend on the CPU platform.
    assert "step 1 guards:" in log and "step 2 guards:" in log
    assert "LLMServerManager: ['rllm_embedded:0']" in log and "Platform override from VERL_PLATFORM: cpu" in log
    # Live progress: a line per step with its reward, lookups and held-out reward.
    lines = [line for line in printed.out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["0", "1", "2"]
    said = printed.out.splitlines()
    warm = next(i for i, line in enumerate(said) if line.startswith("warm start done"))
    assert warm < said.index(lines[0])  # said when it ends, not when verl's first evaluation arrives
    assert all("held-out reward" in line for line in lines) and "reward" in lines[1] and "lookups/episode" in lines[1]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trainer"] == "verl" and summary["steps"] == 2 and summary["passed"] is False
    assert 0.0 <= summary["eval_reward_before"] <= 1.0 and 0.0 <= summary["eval_reward_after"] <= 1.0
    assert summary["seconds"] > summary["verl_seconds"] > 0
    assert abs(float(said[warm].split("(")[1].split("s)")[0]) - summary["warm_start_seconds"]) <= 1, said[warm]
    assert summary["first_logprob_gap_max"] < 1e-3  # the audited rollouts were served the trained weights
    verl_lines = [json.loads(line) for line in (tmp_path / "verl_metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in verl_lines] == [0, 1, 2]
    assert summary["eval_reward_before"] == verl_lines[0]["data"]["val-core/lookup/reward/mean@1"]
    assert summary["eval_reward_after"] == verl_lines[2]["data"]["val-core/lookup/reward/mean@1"]
    for line in verl_lines[1:]:  # bypass mode: the gap guard audited rollouts the actor recomputed
        assert line["data"]["rllm/guard/min_group_size"] == 2 and line["data"]["rllm/guard/logprob_gap_rollouts"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2] and all("eval_reward" in row for row in rows)
    assert {"train_reward", "tool_calls", "logprob_gap_max", "step_seconds"} <= set(rows[-1])
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000

    # The policy verl trained, saved by verl, evaluated on the held-out boxes with AgentWorkflowEngine.
    evaluation = summary["workflow_eval"]
    assert evaluation["episodes"] == TINY["held_out"] * TINY["eval_samples"] and 0.0 <= evaluation["reward"] <= 1.0
    episodes = [Episode.model_validate_json(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == evaluation["episodes"]
    assert all(e.task["question"].startswith("What is the code") and e.trajectories[0].token_trace for e in episodes)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "global_step_2" / "actor" / "huggingface")
    warm = AutoModelForCausalLM.from_pretrained(tmp_path / "warm_start_model")
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), warm.state_dict().values(),
                                                     strict=True))  # RL changed the weights the evaluation ran


def test_the_quickstart_script_lists_its_options_and_keeps_the_search_evaluation_one_flag_away() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OTEL_SDK_DISABLED": "true"}
    train = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh"), "--help"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert train.returncode == 0, train.stderr
    assert "verl's own trainer" in train.stdout and "--rl-steps" in train.stdout
    search = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh"), "--search", "--help"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert search.returncode == 0, search.stderr
    assert "--retrieval-url" in search.stdout and "--scripted" in search.stdout
