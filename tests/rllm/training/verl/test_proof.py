"""The learning proof through verl's trainer: the lookup recipe, its rows, tools and scorer, and a short real run.

The recipe tests compose ``lookup_rloo`` with Hydra and verl's own validation (seconds). The proof's
run through verl's trainer on a tiny configuration is the quickstart's test
(``tests/rllm/proofs/test_quickstart.py``), which runs the same ``run_verl_proof``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from typing import Any

import hydra
import pandas as pd
import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.agents.lookup import LOOKUP_BUDGET, LOOKUP_SYSTEM_PROMPT, LookupWorld  # noqa: E402
from rllm.proofs.local_trainer import ProofConfig  # noqa: E402
from rllm.proofs.verl_trainer import RECIPE, verl_overrides, write_lookup_rows  # noqa: E402
from rllm.training.verl.cpu import CPU_OVERRIDES  # noqa: E402
from rllm.training.verl.train import CONFIG_DIR, prepare_config, validate  # noqa: E402
from rllm.training.verl.trainer.guards import GuardSettings  # noqa: E402


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


def test_a_decaying_rl_learning_rate_is_verls_cosine_schedule_and_the_local_trainers_curve_is_verls(tmp_path) -> None:
    """The quickstart's ``rl_lr_min_ratio``: verl's own scheduler and the local trainer give the same rate per step."""
    import torch
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    from rllm.proofs.local_trainer import rl_learning_rate
    from rllm.proofs.quickstart import quickstart_config

    config = quickstart_config("cpu")
    assert config.rl_lr_min_ratio < 1.0  # the quickstart decays; the proof's default stays constant
    composed = prepare_config(compose(*CPU_OVERRIDES, *verl_overrides(config, tmp_path / "m", tmp_path / "d", tmp_path)))
    optim = composed.actor_rollout_ref.actor.optim
    assert (optim.lr_scheduler_type, optim.min_lr_ratio, optim.lr) == ("cosine", config.rl_lr_min_ratio, config.rl_lr)

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.rl_lr)
    schedule = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=config.rl_steps,
                                               min_lr_ratio=config.rl_lr_min_ratio, num_cycles=optim.num_cycles)
    verls = []
    for _ in range(config.rl_steps):  # verl steps the scheduler after each update
        verls.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    ours = [rl_learning_rate(config, step) for step in range(1, config.rl_steps + 1)]
    assert ours == pytest.approx(verls, rel=1e-12) and ours[0] == config.rl_lr and ours[-1] < 0.2 * config.rl_lr
    constant = ProofConfig.for_device("cpu")
    assert rl_learning_rate(constant, constant.rl_steps) == constant.rl_lr
    assert "lr_scheduler_type" not in " ".join(verl_overrides(constant, tmp_path, tmp_path, tmp_path))


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
        "data.apply_chat_template_kwargs.enable_thinking",  # the chat template (RLHFDataset, StrandsAgentLoop)
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",  # verl's TaskRunnerV1 (RolloutConfig)
        *(f"rllm.guards.{f.name}" for f in dataclasses.fields(GuardSettings)),  # the recipe names every guard
        "rllm.max_infra_failure_share",
        "rllm.reward_fn",  # StrandsAgentLoop scores with it and hands verl the score
        *(f"rllm.agent_loop.{k}" for k in ("tool_factory", "agent_factory", "tool_kwargs.world_size",
                                           "tool_kwargs.seed", "system_prompt", "budget", "timeout_s",
                                           "infra_exceptions", "max_tokens_per_turn", "own_client")),
    }


def test_the_recipes_tools_budget_and_scorer_answer_the_rows(tmp_path) -> None:
    """What each rollout worker builds from the recipe's dotted paths fits the rows the proof writes."""
    from rllm.rewards.base import score_answer
    from rllm.training.verl._dotted import import_object
    from rllm.training.verl.agent_loop import build_tools, loop_settings, row_task_or_row, split_prompt
    from rllm.training.verl.reward import reward_numbers

    config = ProofConfig.for_device("cpu", world_size=200, seed=3)
    world = LookupWorld(config.world_size, seed=config.seed)
    write_lookup_rows(*world.split(8), tmp_path / "data")
    composed = prepare_config(compose(*verl_overrides(config, tmp_path / "model", tmp_path / "data", tmp_path)))
    settings = loop_settings(composed)
    assert settings.budget == LOOKUP_BUDGET and settings.block.system_prompt is None and settings.tool_parser == "hermes"
    (lookup,) = build_tools(settings.block.tool_factory, settings.block.tool_kwargs)

    row = pd.read_parquet(tmp_path / "data" / "validation.parquet").iloc[3]
    system, messages = split_prompt(row["prompt"])
    assert system == LOOKUP_SYSTEM_PROMPT
    box = int(row["extra_info"]["box"])
    assert messages[0]["content"][0]["text"] == f"What is the code of the item in box {box}?"
    item = lookup(key=f"box {box}")  # the worker's world is the rows' world, rebuilt from the seed
    assert item.startswith("item ") and lookup(key=item) == f"code {row['reward_model']['ground_truth']}"

    reward_fn = import_object(settings.reward_fn)  # scoring the row as the loop hands it over, two tool calls made
    task = row_task_or_row({**row.to_dict(), "raw_prompt": row["prompt"]})

    def numbers(final_answer: str) -> dict[str, float]:
        return reward_numbers(asyncio.run(score_answer(reward_fn, task, final_answer)), tool_calls=2)

    right = numbers(f"\\boxed{{{row['reward_model']['ground_truth']}}}")
    wrong = numbers(item)
    assert right == {"score": 1.0, "boxed": 1.0, "correct": 1.0, "tool_calls": 2.0}
    assert wrong == {"score": 0.0, "boxed": 0.0, "correct": 0.0, "tool_calls": 2.0}


@pytest.mark.parametrize(("before", "after", "gap", "expected"), [
    (0.35, 0.80, 1e-5, []),
    (0.55, 0.75, 1e-5, ["rose by 0.200"]),
    (0.60, 0.65, 1e-5, ["rose by 0.050", "ended at 0.650"]),
    (0.35, 0.80, 0.2, ["does not serve the trained weights"]),
    (math.nan, 0.80, 1e-5, ["no held-out reward"]),
])
def test_the_verl_proof_fails_by_the_local_proofs_rule(tmp_path, before, after, gap, expected) -> None:
    """The same thresholds judge both trainers: too small a rise, too low an end, a stale rollout, no validation."""
    from rllm.proofs.verl_trainer import VerlProofResult

    config = ProofConfig.for_device("cpu")
    result = VerlProofResult(config=config, eval_reward_before=before, eval_reward_after=after,
                             first_logprob_gap_max=gap, steps=config.rl_steps, seconds=1.0, warm_start_seconds=0.5,
                             verl_seconds=0.5, returncode=0, log_path=tmp_path / "verl.log")

    assert result.passed == (not expected)
    assert len(result.failures) == len(expected)
    for failure, words in zip(result.failures, expected, strict=True):
        assert words in failure
