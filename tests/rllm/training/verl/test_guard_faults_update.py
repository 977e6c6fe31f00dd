"""Guards on the update, each shown stopping verl's own trainer on an injected fault: a NaN loss, a LoRA actor that
trains a weight outside its adapter. (The constant reward's stop, a guard on the rollouts' rewards, runs with the
malformed calls' in ``test_guard_faults_rollout.py``: both need three steps of evidence.)

Every run is ``python -m rllm.training.verl.train --cpu`` on the lookup recipe
(``fixtures.verl_fault_runs``); the faults come from outside the code under test (verl's own policy
loss wrapped by ``fixtures.verl_faults`` in every process, or peft's ``get_peft_model``). Each run
must exit non-zero with the step and the guard in its output.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.verl_fault_runs import train  # noqa: E402 - skips this module without the train extra

pytestmark = pytest.mark.slow(verl_runs=2)


@pytest.mark.timeout(900)
def test_a_nan_loss_stops_verls_trainer_before_the_weights_are_synced(fault_run_model: Path, tmp_path: Path) -> None:
    run = train(fault_run_model, tmp_path, fault="nan_loss")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: actor/loss is nan; stopping instead of training on it" in run.output, run.output[-3000:]
    assert run.metrics and run.metrics[-1]["step"] == 1  # the stop logged the step's metrics first


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
