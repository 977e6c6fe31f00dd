"""A user's own agent through verl's own trainer on CPU: the run the split-rollout guard must not stop.

The recipe names a user's agent factory (a plain ``strands.Agent`` under a per-turn sliding window,
``fixtures.verl_faults.windowed_lookup_agent``); its rewritten histories come back as several samples
per rollout, and verl must train on exactly those samples, each rollout's advantage counted once.
``python -m rllm.training.verl.train --cpu`` on the lookup recipe (``fixtures.verl_fault_runs``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.verl_fault_runs import train  # noqa: E402 - skips this module without the train extra

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_users_agent_whose_history_a_sliding_window_rewrites_trains_two_verl_steps_on_exactly_its_samples(
        fault_run_model: Path, tmp_path: Path) -> None:
    # Not a fault: the recipe names a user's factory (a plain strands.Agent under a per-turn sliding window of 4)
    # and the rollout server plays a policy that looks a box up on every turn, so each rollout's history is
    # rewritten and comes back as several samples. Its log-probs are scripted, so the gap guard is off here.
    run = train(fault_run_model, tmp_path, "rllm.agent_loop.tool_factory=null",
                 "rllm.agent_loop.agent_factory=fixtures.verl_faults:windowed_lookup_agent",
                 "rllm.guards.max_logprob_gap=null", "trainer.total_training_steps=2", fault="scripted_lookups",
                 response_length=1024)
    assert run.returncode == 0, run.output[-3000:]
    assert [m["step"] for m in run.metrics] == [1, 2]
    assert all(m["data"]["rllm/guard/split_rollouts"] > 0 for m in run.metrics)

    samples = [json.loads(line) for path in tmp_path.glob("samples-*.jsonl") for line in path.read_text().splitlines()]
    rows = [json.loads(line) for path in tmp_path.glob("rows-*.jsonl") for line in path.read_text().splitlines()]
    trained = [r for r in rows if not r["padding"]]
    stored = [s for s in samples if not s["validate"]]
    per_rollout: dict[str, int] = {}
    for sample in stored:
        per_rollout[sample["rollout"]] = per_rollout.get(sample["rollout"], 0) + 1
    assert len(per_rollout) == 2 * 2 * 2 and max(per_rollout.values()) > 1  # 2 steps x 2 prompts x 2 rollouts
    # The rows verl trained on are exactly the samples the loop returned: tokens and loss mask, each once.
    assert sorted((r["ids"], r["mask"]) for r in trained) == sorted((s["ids"], s["mask"]) for s in stored)
    # One advantage per rollout (RLOO over rollouts, not rows), on every sampled token of each of its samples.
    by_rollout: dict[tuple[int, str], set[float]] = {}
    for row in trained:
        rollout = row["key"].rpartition("_")[0]
        by_rollout.setdefault((row["step"], rollout), set()).update(round(a, 6) for a in row["advantages"])
    assert all(len(values) == 1 for values in by_rollout.values()), by_rollout
    # varied_score gives the two rollouts of a prompt 0 and 1: leave-one-out advantages +1 and -1 per rollout
    # (verl's own RLOO over rows would count each sample as a rollout: +-0.6 for three samples each).
    assert {value for values in by_rollout.values() for value in values} == {1.0, -1.0}
