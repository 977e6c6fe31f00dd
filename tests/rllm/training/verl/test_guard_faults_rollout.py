"""Guards on what the rollout serves and returns, each shown stopping verl's own trainer on an injected fault.

Weights that stop arriving at the rollout server, a LoRA adapter that stops arriving, a generation the server
cuts (its group left with one rollout) together with responses cut at the response length (one stop names
both), a tool agent that never calls its tools, a policy whose every tool call the parser cannot read together
with a reward that never varies (two stops that need three steps' evidence, named together by one stop). Every
run is ``python -m rllm.training.verl.train --cpu`` on the lookup recipe (``fixtures.verl_fault_runs``); the
faults come from outside the code under test (``fixtures.verl_faults``, imported by verl into every
process, or the recipe, as for the tool agent: the random policy never writes a call). Each run must exit
non-zero with the step and the guard in its output.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.verl_fault_runs import train  # noqa: E402 - skips this module without the train extra

pytestmark = pytest.mark.slow(verl_runs=5)


@pytest.mark.timeout(900)
def test_weights_that_stop_arriving_stop_verls_trainer_at_the_recipes_learning_rate(fault_run_model: Path,
                                                                                     tmp_path: Path) -> None:
    # Every sync after the first re-sends the first sync's tensors; at the HotpotQA recipe's lr (1e-6) the
    # log-prob gap cannot see it. The same run asks for verl's full determinism, which verl's run_ppo puts in the
    # environment before it starts Ray: every process of the run must have it.
    run = train(fault_run_model, tmp_path, "actor_rollout_ref.actor.optim.lr=1e-6",
                 "actor_rollout_ref.rollout.full_determinism=true", fault="stale_weights",
                 probe="VERL_FULL_DETERMINISM,PYTHONHASHSEED")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: after the weight sync, rollout server 0 serves weights that are not the actor's" in run.output
    assert "TrainingGuardError" in run.output
    assert "step 1 guards:" not in run.output and "step 2 guards:" not in run.output  # stopped before its metrics
    probes = [json.loads(p.read_text()) for p in tmp_path.glob("env-*.json")]
    workers = [p for p in probes if "default_worker" in p["argv"]]
    assert len(workers) >= 3, probes  # the task runner, the FSDP worker, the rollout server, the agent loop, ...
    assert all(p["env"]["VERL_FULL_DETERMINISM"] == "1" for p in workers), workers


@pytest.mark.timeout(900)
def test_a_stale_lora_adapter_stops_verls_trainer_naming_the_adapter_tensor(fault_run_model: Path,
                                                                             tmp_path: Path) -> None:
    # verl's own LoRA keys and nothing else about LoRA; every adapter sync after the first re-sends the first
    # one's adapter (verl #7495: the rollout keeps sampling from the initial adapter). The transport check passes
    # (what arrived is what was sent); the served adapter is not the actor's after step 1's update.
    run = train(fault_run_model, tmp_path, "actor_rollout_ref.model.lora_rank=8", fault="stale_adapter")
    assert run.returncode != 0, run.output[-3000:]
    assert re.search(r"the actor trains \d+ of its \d+ parameters .*, all of them LoRA adapter weights", run.output)
    assert re.search(r"step 1: after the weight sync, rollout server 0 serves weights that are not the actor's: "
                     r"base_model\.model\.\S+\.lora_[AB]\.default\.weight differs from the actor's", run.output)
    assert "step 1 guards:" not in run.output  # stopped before its metrics
    assert "WeightSyncError" not in run.output  # not the transport check: the fingerprint of what is served


@pytest.mark.timeout(900)
def test_a_group_left_with_one_rollout_and_responses_cut_beyond_the_share_stop_verls_trainer_in_one_stop(
        fault_run_model: Path, tmp_path: Path) -> None:
    # Two faults of step 1's rollouts in one run: the server cuts the first generation (its group is left with one
    # rollout), and the random-init policy runs to the response length. The groups are checked before the actor
    # reads the batch; that stop names the cut responses too. The policy sometimes samples its end token in time
    # (CI once saw three of the four responses cut): the limit leaves room for that, and the guard must name the
    # share it saw.
    run = train(fault_run_model, tmp_path, "rllm.guards.max_truncated_share=0.25", fault="abort_first_generation")
    assert run.returncode != 0, run.output[-3000:]
    assert "rollout excluded from the update (engine_error)" in run.output  # the cut generation was dropped
    assert "step 1: a group has 1 rollout(s); RLOO needs at least 2 per prompt" in run.output, run.output[-3000:]
    cut = re.search(r"also step 1: (\d+)% of the responses were cut at response_length "
                    r"\(rllm\.guards\.max_truncated_share=0\.25\)", run.output)
    assert cut is not None, run.output[-3000:]
    assert int(cut.group(1)) > 25, cut.group(0)


@pytest.mark.timeout(900)
def test_a_tool_agent_that_never_calls_its_tools_stops_verls_trainer_naming_the_parser(fault_run_model: Path,
                                                                                    tmp_path: Path) -> None:
    # The lookup agent has its tool, but the random-init policy never writes a call the Hermes parser reads (as a
    # model whose call format the parser does not match): a loud warning at step 1, the stop at step 2.
    run = train(fault_run_model, tmp_path, "rllm.guards.max_steps_without_tool_calls=2")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: TOOLS NEVER CALLED: agents with tools made no tool call in any episode" in run.output
    assert re.search(r"TrainingGuardError: step 2: agents with tools called none in 2 step\(s\) in a row "
                     r"\(rllm\.guards\.max_steps_without_tool_calls=2\): likely the tool parser "
                     r"\(actor_rollout_ref\.rollout\.multi_turn\.format\)", run.output), run.output[-3000:]
    assert [m["step"] for m in run.metrics] == [1, 2]
    assert all(m["data"]["rllm/guard/tool_agent_calls_per_episode"] == 0 for m in run.metrics)


@pytest.mark.timeout(900)
def test_malformed_tool_calls_and_a_constant_reward_stop_verls_trainer_only_after_three_steps_of_evidence(
        fault_run_model: Path, tmp_path: Path) -> None:
    # Two faults, two guards that each wait for three steps in a row, in one run: every call the policy writes is
    # one the Hermes parser cannot read (arguments that are not JSON), and the scorer gives every rollout the same
    # reward. At the recipe's defaults the first such step only warns (a random model's smoke run writes a few
    # malformed calls by chance); the stop comes at the third step, naming both reasons with the steps and counts.
    run = train(fault_run_model, tmp_path, "rllm.guards.max_malformed_tool_call_share=1.0",
                "rllm.guards.max_logprob_gap=null", "rllm.reward_fn=fixtures.verl_faults:constant_score",
                fault="malformed_calls", response_length=512)
    assert run.returncode != 0, run.output[-3000:]
    assert re.search(r"step 1: MALFORMED TOOL CALLS: \d+ of \d+ tool calls malformed", run.output), run.output[-3000:]
    assert "step 3: 100% of the tool calls were malformed, the share over the limit in 3 step(s) in a row" \
        in run.output, run.output[-3000:]
    assert re.search(r"steps 1-3: (\d+) of \1, (\d+) of \2, (\d+) of \3 tool calls malformed", run.output)
    assert "step 3: the reward was the same for every rollout of every group for 3 step(s) in a row" in run.output
    assert [m["step"] for m in run.metrics] == [1, 2, 3]  # steps 1 and 2 trained: one step is not evidence
    assert all(m["data"]["rllm/guard/groups_with_signal_share"] == 0 for m in run.metrics)
