"""Each training guard shown stopping verl's own trainer, on a fault injected from outside the code under test.

Beside them, the run a guard must not stop: a user's agent whose history a sliding window rewrites,
trained for two steps on exactly its samples, each rollout counted once.

Every run is ``python -m rllm.training.verl.train --cpu`` on the lookup recipe (verl 0.9.1's v1 trainer,
Ray, FSDP2, TransferQueue, the embedded rollout backend, ``StrandsAgentLoop``, the guarded trainer),
sized to a tiny model and two prompts of two rollouts. The faults come from ``tests/fixtures/verl_faults.py``,
which verl itself imports into every process of the run (``VERL_USE_EXTERNAL_MODULES``), or from the
recipe (a scorer, a response length): nothing in ``rllm`` is patched. Each run must exit non-zero with
the step and the guard in its output. The model, rows and tokenizer are built once for all runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

for _module in ("verl", "ray", "transfer_queue"):
    pytest.importorskip(_module, reason=f"{_module} is not installed: the fault runs need the train extra")

from rllm.agents.lookup import LookupWorld  # noqa: E402
from rllm.testing.chat_templates import load_chat_template  # noqa: E402
from rllm.testing.qwen_tokenizer import QwenVocab, build_qwen_tokenizer  # noqa: E402
from rllm.testing.tiny_models import build_tiny_qwen3  # noqa: E402
from rllm.training.verl.proof import RECIPE, write_lookup_rows  # noqa: E402

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[3]
REPO = TESTS.parent
RESPONSE_LENGTH = 48


@dataclass
class Run:
    returncode: int
    output: str
    metrics: list[dict]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 on Qwen's first 8k ranks and the lookup rows, shared by every run."""
    root = tmp_path_factory.mktemp("faults")
    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)
    build_tiny_qwen3(tokenizer, root / "model", seed=0, hidden_size=64, num_layers=2)
    world = LookupWorld(60, seed=0)
    write_lookup_rows(*world.split(4), root / "data")
    return root


def _train(prepared: Path, out: Path, *overrides: str, fault: str = "", probe: str = "",
           response_length: int = RESPONSE_LENGTH) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "verl_metrics.jsonl"
    command = [
        sys.executable, "-m", "rllm.training.verl.train", "--cpu",
        f"actor_rollout_ref.model.path={prepared / 'model'}",
        f"data.train_files={prepared / 'data' / 'train.parquet'}",
        f"data.val_files={prepared / 'data' / 'validation.parquet'}",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "data.max_prompt_length=512", f"data.max_response_length={response_length}",
        f"actor_rollout_ref.rollout.max_model_len={512 + response_length}",
        "rllm.agent_loop.tool_kwargs.world_size=60", "trainer.total_training_steps=3", "trainer.total_epochs=3",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.default_local_dir={out / 'checkpoints'}", f"hydra.run.dir={out / 'hydra'}",
        "reward.custom_reward_function.reward_kwargs.scorer=fixtures.verl_faults:varied_score",
        # A random policy writes to the end of every response: only the truncation run keeps that guard on.
        "rllm.guards.max_truncated_share=null",
        "++ray_kwargs.ray_init.include_dashboard=false",  # nothing reads it; its processes cost CI seconds
        *overrides, "--config-name", RECIPE,
    ]
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "fixtures.verl_faults", "RLLM_TEST_FAULT": fault,
           "RLLM_TEST_FAULT_DIR": str(out), "RLLM_TEST_ENV_PROBE": probe,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "VERL_FILE_LOGGER_PATH": str(metrics_path), "RAY_DEDUP_LOGS": "0"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=out)
    lines = metrics_path.read_text().splitlines() if metrics_path.exists() else []
    return Run(run.returncode, run.stdout + run.stderr, [json.loads(line) for line in lines])


@pytest.mark.timeout(900)
def test_weights_that_stop_arriving_stop_verls_trainer_at_the_recipes_learning_rate(prepared: Path,
                                                                                     tmp_path: Path) -> None:
    # Every sync after the first re-sends the first sync's tensors; at the HotpotQA recipe's lr (1e-6) the
    # log-prob gap cannot see it. The same run asks for verl's full determinism, which verl's run_ppo puts in the
    # environment before it starts Ray: every process of the run must have it.
    run = _train(prepared, tmp_path, "actor_rollout_ref.actor.optim.lr=1e-6",
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
def test_a_nan_loss_stops_verls_trainer_before_the_weights_are_synced(prepared: Path, tmp_path: Path) -> None:
    run = _train(prepared, tmp_path, fault="nan_loss")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: actor/loss is nan; stopping instead of training on it" in run.output, run.output[-3000:]
    assert run.metrics and run.metrics[-1]["step"] == 1  # the stop logged the step's metrics first


@pytest.mark.timeout(900)
def test_a_constant_reward_stops_verls_trainer_after_three_steps(prepared: Path, tmp_path: Path) -> None:
    run = _train(prepared, tmp_path, "reward.custom_reward_function.reward_kwargs.scorer=fixtures.verl_faults:constant_score")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 3: the reward was the same for every rollout of every group for 3 step(s) in a row" in run.output
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    assert all(m["data"]["rllm/guard/groups_with_signal_share"] == 0 for m in run.metrics)


@pytest.mark.timeout(900)
def test_a_group_left_with_one_rollout_stops_verls_trainer(prepared: Path, tmp_path: Path) -> None:
    run = _train(prepared, tmp_path, fault="abort_first_generation")
    assert run.returncode != 0, run.output[-3000:]
    assert "rollout excluded from the update (engine_error)" in run.output  # the cut generation was dropped
    assert "step 1: a group has 1 rollout(s); RLOO needs at least 2 per prompt" in run.output, run.output[-3000:]


@pytest.mark.timeout(900)
def test_responses_cut_beyond_the_share_stop_verls_trainer(prepared: Path, tmp_path: Path) -> None:
    run = _train(prepared, tmp_path, "rllm.guards.max_truncated_share=0.5")
    assert run.returncode != 0, run.output[-3000:]
    assert "step 1: 100% of the responses were cut at response_length" in run.output, run.output[-3000:]


@pytest.mark.timeout(900)
def test_a_users_agent_whose_history_a_sliding_window_rewrites_trains_two_verl_steps_on_exactly_its_samples(
        prepared: Path, tmp_path: Path) -> None:
    # Not a fault: the recipe names a user's factory (a plain strands.Agent under a per-turn sliding window of 4)
    # and the rollout server plays a policy that looks a box up on every turn, so each rollout's history is
    # rewritten and comes back as several samples. Its log-probs are scripted, so the gap guard is off here.
    run = _train(prepared, tmp_path, "rllm.agent_loop.tool_factory=null",
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
