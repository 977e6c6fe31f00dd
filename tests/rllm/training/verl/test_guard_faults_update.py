"""Guards on the update, each shown stopping verl's own trainer on an injected fault: a NaN loss, a constant reward,
a LoRA actor that trains a weight outside its adapter.

Every run is ``python -m rllm.training.verl.train --cpu`` on the lookup recipe
(``fixtures.verl_fault_runs``); the faults come from outside the code under test (verl's own policy
loss wrapped by ``fixtures.verl_faults`` in every process, or a scorer named in the recipe). Each run
must exit non-zero with the step and the guard in its output.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.verl_fault_runs import train  # noqa: E402 - skips this module without the train extra

pytestmark = pytest.mark.slow(verl_runs=3)


@pytest.mark.timeout(900)
def test_a_nan_loss_stops_verls_trainer_before_the_weights_are_synced(fault_run_model: Path, tmp_path: Path) -> None:
    run = train(fault_run_model, tmp_path, fault="nan_loss")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: actor/loss is nan; stopping instead of training on it" in run.output, run.output[-3000:]
    assert run.metrics and run.metrics[-1]["step"] == 1  # the stop logged the step's metrics first


@pytest.mark.timeout(900)
def test_a_constant_reward_stops_verls_trainer_after_three_steps(fault_run_model: Path, tmp_path: Path) -> None:
    run = train(fault_run_model, tmp_path,
                "rllm.reward_fn=fixtures.verl_faults:constant_score")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 3: the reward was the same for every rollout of every group for 3 step(s) in a row" in run.output
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    assert all(m["data"]["rllm/guard/groups_with_signal_share"] == 0 for m in run.metrics)


@pytest.mark.timeout(900)
def test_a_lora_actor_training_outside_its_adapter_stops_verls_trainer_before_step_one(fault_run_model: Path,
                                                                                        tmp_path: Path) -> None:
    # verl's own LoRA keys; the fault leaves the final norm trainable beside the adapter, right after verl's own
    # get_peft_model call. The run would train it as a LoRA run while the adapter export drops it.
    run = train(fault_run_model, tmp_path, "actor_rollout_ref.model.lora_rank=8", fault="trainable_base")
    assert run.returncode != 0, run.output[-3000:]
    assert ("the LoRA actor also trains 1 parameters outside its adapter (base_model.model.model.norm.weight): "
            "a LoRA run trains the adapter only") in run.output, run.output[-3000:]
    assert not run.metrics  # stopped before the first step
