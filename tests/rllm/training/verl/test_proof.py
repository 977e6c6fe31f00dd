"""The learning proof through verl's trainer: the lookup recipe, its rows, tools and scorer, and a short real run.

The recipe tests compose ``lookup_rloo`` with Hydra and verl's own validation (seconds). The run test
is the proof's plumbing on a tiny configuration: a few warm-start steps, then two RLOO steps of verl's
v1 trainer on the CPU with the embedded rollout backend, validating before and after (minutes). It
asserts that the run went through verl's trainer and reported held-out reward, not that it learns
(the full run does: README, "Proof that it learns").
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.agents.lookup import LOOKUP_BUDGET, LOOKUP_SYSTEM_PROMPT, LookupWorld  # noqa: E402
from rllm.training.local.proof import ProofConfig  # noqa: E402
from rllm.training.verl.cpu import CPU_OVERRIDES  # noqa: E402
from rllm.training.verl.proof import RECIPE, run_verl_proof, verl_overrides, write_lookup_rows  # noqa: E402
from rllm.training.verl.train import CONFIG_DIR, prepare_config, validate  # noqa: E402

TINY = {"hidden_size": 64, "num_layers": 2, "world_size": 120, "held_out": 4, "eval_samples": 1, "demonstrations": 16,
        "warm_steps": 4, "warm_batch": 8, "rl_steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 2,
        "eval_every": 1, "micro_batch_size": 4, "response_length": 64}
# Four warm-start steps leave the model nearly random: it writes to the end of every response, which the
# truncation guard would (rightly) stop; the full proof's warm start ends its turns.
PLUMBING_ONLY = ("rllm.guards.max_truncated_share=null",)


def compose(*overrides: str) -> Any:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra.compose(config_name=RECIPE, overrides=list(overrides))


def test_the_lookup_recipe_takes_the_proofs_settings_and_passes_verls_validation(tmp_path) -> None:
    config = ProofConfig.for_device("cpu")
    world = LookupWorld(config.world_size, seed=config.seed)
    train_path, val_path = write_lookup_rows(*world.split(config.held_out), tmp_path / "data")
    composed = prepare_config(compose(*CPU_OVERRIDES, *verl_overrides(config, tmp_path / "model", tmp_path / "data",
                                                                      tmp_path)))
    validate(composed)  # verl's validate_config, the agent loop's settings and the launch checks

    rollout, actor = composed.actor_rollout_ref.rollout, composed.actor_rollout_ref.actor
    assert composed.algorithm.adv_estimator == "rloo" and rollout.name == "rllm_embedded"
    # The local proof's settings: 8 boxes x 8 rollouts, one optimizer step per RL step, lr, temperature, lengths.
    assert (composed.data.train_batch_size, rollout.n) == (config.prompts_per_step, config.rollouts_per_prompt)
    assert actor.ppo_mini_batch_size == config.prompts_per_step and actor.ppo_epochs == 1
    assert actor.optim.lr == config.rl_lr and rollout.temperature == config.temperature
    assert composed.data.max_response_length == config.response_length
    assert actor.ppo_micro_batch_size_per_gpu == config.micro_batch_size
    assert actor.fsdp_config.mixed_precision.param_dtype == "fp32" and rollout.dtype == "float32"
    # Held-out reward as the local proof measures it: every held-out box, 2 samples at temperature 1, every 5 steps.
    assert (rollout.val_kwargs.n, rollout.val_kwargs.temperature, rollout.val_kwargs.do_sample) == (2, 1.0, True)
    assert composed.trainer.val_before_train and composed.trainer.test_freq == config.eval_every
    assert composed.trainer.total_training_steps == config.rl_steps
    assert composed.data.train_files == str(train_path.resolve()) and composed.data.val_files == str(val_path.resolve())
    val_rows = pd.read_parquet(val_path)
    assert len(val_rows) == config.held_out and len(pd.read_parquet(train_path)) == config.world_size - config.held_out


def test_every_lookup_recipe_key_is_a_verl_key_or_one_the_loop_reads() -> None:
    """A misspelt key would be silently ignored by verl: each is in verl's base config or a known addition."""
    import yaml
    from omegaconf import OmegaConf

    recipe = yaml.safe_load((CONFIG_DIR / f"{RECIPE}.yaml").read_text())
    recipe.pop("hydra"), recipe.pop("defaults")
    with hydra.initialize_config_module(config_module="verl.trainer.config", version_base=None):
        base = hydra.compose(config_name="ppo_trainer")

    def leaves(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [leaf for key, value in node.items() for leaf in leaves(value, f"{prefix}{key}.")]
        return [prefix.rstrip(".")]

    def declared(key: str) -> bool:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(base, parent_key)
        return OmegaConf.is_dict(parent) and leaf in list(parent.keys())

    added = {key for key in leaves(recipe) if not declared(key)}
    assert added == {
        "actor_rollout_ref.model.override_config.attn_implementation",  # verl's HFModelConfig reads it
        *(f"actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}" for k in ("param_dtype", "reduce_dtype",
                                                                               "buffer_dtype")),
        "reward.custom_reward_function.reward_kwargs.scorer",  # rllm.training.verl.reward.compute_score
        "data.apply_chat_template_kwargs.enable_thinking",  # the chat template (RLHFDataset, StrandsAgentLoop)
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",  # verl's TaskRunnerV1 (RolloutConfig)
        *(f"rllm.guards.{k}" for k in ("max_logprob_gap", "min_rollouts_per_group", "max_truncated_share",
                                       "max_steps_without_signal", "warn_on_tool_collapse")),
        "rllm.max_infra_failure_share",
        *(f"rllm.agent_loop.{k}" for k in ("tool_factory", "tool_kwargs.world_size", "tool_kwargs.seed",
                                           "system_prompt", "budget", "timeout_s", "infra_exceptions")),
    }


def test_the_recipes_tools_budget_and_scorer_answer_the_rows(tmp_path) -> None:
    """What each rollout worker builds from the recipe's dotted paths fits the rows the proof writes."""
    from rllm.training.verl.agent_loop import build_tools, loop_settings, split_prompt
    from rllm.training.verl.reward import compute_score

    config = ProofConfig.for_device("cpu", world_size=200, seed=3)
    world = LookupWorld(config.world_size, seed=config.seed)
    write_lookup_rows(*world.split(8), tmp_path / "data")
    composed = prepare_config(compose(*verl_overrides(config, tmp_path / "model", tmp_path / "data", tmp_path)))
    settings = loop_settings(composed)
    assert settings.budget == LOOKUP_BUDGET and settings.system_prompt is None and settings.tool_parser == "hermes"
    (lookup,) = build_tools(settings.tool_factory, settings.tool_kwargs)

    row = pd.read_parquet(tmp_path / "data" / "validation.parquet").iloc[3]
    system, messages = split_prompt(row["prompt"])
    assert system == LOOKUP_SYSTEM_PROMPT
    box = int(row["extra_info"]["box"])
    assert messages[0]["content"][0]["text"] == f"What is the code of the item in box {box}?"
    item = lookup(key=f"box {box}")  # the worker's world is the rows' world, rebuilt from the seed
    assert item.startswith("item ") and lookup(key=item) == f"code {row['reward_model']['ground_truth']}"

    kwargs = dict(composed.reward.custom_reward_function.reward_kwargs)
    info = {**dict(row["extra_info"]), "num_tool_calls": 2}
    right = compute_score(row["data_source"], "", row["reward_model"]["ground_truth"],
                          {**info, "final_answer": f"\\boxed{{{row['reward_model']['ground_truth']}}}"}, **kwargs)
    wrong = compute_score(row["data_source"], "", row["reward_model"]["ground_truth"],
                          {**info, "final_answer": item}, **kwargs)
    assert right == {"score": 1.0, "boxed": 1.0, "tool_calls": 2.0}
    assert wrong == {"score": 0.0, "boxed": 0.0, "tool_calls": 2.0}


@pytest.mark.timeout(1200)
def test_the_verl_proof_runs_through_verls_trainer_and_reports_held_out_reward(tmp_path) -> None:
    for module in ("verl", "ray", "transfer_queue"):  # the train extra; the dev extra installs it
        pytest.importorskip(module, reason=f"{module} is not installed: the verl proof needs the train extra")
    config = ProofConfig.for_device("cpu", **TINY)
    seen: list[dict[str, Any]] = []

    result = run_verl_proof(config, tmp_path, on_step=seen.append, overrides=PLUMBING_ONLY)

    log = result.log_path.read_text(encoding="utf-8", errors="replace")
    assert result.returncode == 0, log[-4000:]
    # verl's own trainer ran, with the guarded task runner and the embedded backend on the CPU platform.
    assert "step 1 guards:" in log and "step 2 guards:" in log
    assert "LLMServerManager: ['rllm_embedded:0']" in log and "Platform override from VERL_PLATFORM: cpu" in log
    verl_lines = [json.loads(line) for line in (tmp_path / "verl_metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in verl_lines] == [0, 1, 2]
    assert all("val-core/lookup/reward/mean@1" in line["data"] for line in verl_lines)
    assert all(line["data"]["rllm/guard/min_group_size"] == 2 for line in verl_lines[1:])
    # Held-out reward before and after, read from verl's validation; the rollout served the trained weights.
    assert 0.0 <= result.eval_reward_before <= 1.0 and 0.0 <= result.eval_reward_after <= 1.0
    assert result.eval_reward_before == verl_lines[0]["data"]["val-core/lookup/reward/mean@1"]
    assert result.eval_reward_after == verl_lines[2]["data"]["val-core/lookup/reward/mean@1"]
    assert result.steps == 2 and result.first_logprob_gap_max < 1e-3
    assert [row["step"] for row in seen] == [0, 1, 2] and all("eval_reward" in row for row in seen)
    assert {"train_reward", "tool_calls", "logprob_gap_max", "step_seconds"} <= set(seen[-1])
    assert not math.isnan(seen[-1]["train_reward"])
    # Two steps cannot learn: the proof says so, and why.
    summary = result.summary()
    assert summary["trainer"] == "verl" and summary["steps"] == 2 and summary["passed"] is False
    assert any("held-out reward" in failure for failure in summary["failures"])
    assert not any("exited" in failure or "logged" in failure for failure in summary["failures"])
    # The warm-started model verl trained from, loadable as saved.
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in (tmp_path / "warm_start_model").iterdir()}
    assert Path(tmp_path / "metrics.jsonl").read_text().count("\n") == 3


@pytest.mark.parametrize(("before", "after", "gap", "expected"), [
    (0.35, 0.80, 1e-5, []),
    (0.55, 0.75, 1e-5, ["rose by 0.200"]),
    (0.60, 0.65, 1e-5, ["rose by 0.050", "ended at 0.650"]),
    (0.35, 0.80, 0.2, ["does not serve the trained weights"]),
    (math.nan, 0.80, 1e-5, ["no held-out reward"]),
])
def test_the_verl_proof_fails_by_the_local_proofs_rule(tmp_path, before, after, gap, expected) -> None:
    """The same thresholds judge both trainers: too small a rise, too low an end, a stale rollout, no validation."""
    from rllm.training.verl.proof import VerlProofResult

    config = ProofConfig.for_device("cpu")
    result = VerlProofResult(config=config, eval_reward_before=before, eval_reward_after=after,
                             first_logprob_gap_max=gap, steps=config.rl_steps, seconds=1.0, warm_start_seconds=0.5,
                             verl_seconds=0.5, returncode=0, log_path=tmp_path / "verl.log")

    assert result.passed == (not expected)
    assert len(result.failures) == len(expected)
    for failure, words in zip(result.failures, expected, strict=True):
        assert words in failure
