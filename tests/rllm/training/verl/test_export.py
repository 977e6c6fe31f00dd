"""The model a run leaves: the recipes' export keys, and the final Hugging Face model found after a run.

The recipes as Hydra composes them (the base recipe, the smoke overlay); a run directory laid out as
verl 0.9.1 leaves it (``latest_checkpointed_iteration.txt``, ``global_step_N/actor/huggingface``) with a real
tiny Qwen3 saved there, which ``final_model_dir`` finds and transformers loads; and the cases it must not
report: a checkpoint without weights (``hf_model`` not saved), an earlier run's tracker, none at all.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from rllm.offline.tiny_models import build_tiny_qwen3, build_tiny_tokenizer
from rllm.training.verl.export import TRACKER, final_model_dir, model_files_missing, report_final_model
from rllm.training.verl.train import CONFIG_DIR, CONFIG_NAME


def _compose(*overrides: str) -> object:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = hydra.compose(config_name=CONFIG_NAME, overrides=list(overrides))
    OmegaConf.resolve(config)
    return config


def test_the_base_recipe_exports_the_policy_at_every_checkpoint_and_keeps_three() -> None:
    config = _compose()
    assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.save_contents  # type: ignore[attr-defined]
    assert {"model", "optimizer", "extra"} <= set(config.actor_rollout_ref.actor.checkpoint.save_contents)  # type: ignore[attr-defined]
    trainer = config.trainer  # type: ignore[attr-defined]
    assert trainer.save_freq == 50 and trainer.max_actor_ckpt_to_keep == 3
    assert trainer.val_before_train and trainer.test_freq == 50


@pytest.mark.parametrize("steps", [None, 5])
def test_a_smoke_run_exports_its_last_steps_policy_only(steps: int | None) -> None:
    extra = [] if steps is None else [f"trainer.total_training_steps={steps}"]
    config = _compose("+overlay=smoke", *extra)
    trainer = config.trainer  # type: ignore[attr-defined]
    assert trainer.save_freq == trainer.total_training_steps == (steps or 2)  # verl saves at the last step only
    assert list(config.actor_rollout_ref.actor.checkpoint.save_contents) == ["hf_model"]  # type: ignore[attr-defined]
    assert trainer.test_freq == -1 and not trainer.val_before_train


def _checkpoint(run_dir: Path, step: int, *, weights: bool = True) -> Path:
    """``run_dir`` as verl leaves it after saving step ``step``: the tracker and the actor's Hugging Face folder."""
    folder = run_dir / f"global_step_{step}" / "actor" / "huggingface"
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen3(tokenizer)
    if weights:
        model.save_pretrained(folder)
    else:  # what verl writes without hf_model in save_contents: the config and tokenizer, no weights
        model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (run_dir / TRACKER).write_text(str(step), encoding="utf-8")
    return folder


def test_the_final_model_is_the_last_checkpoints_export_and_transformers_loads_it(tmp_path: Path, caplog) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.time()
    _checkpoint(tmp_path, 1)
    folder = _checkpoint(tmp_path, 2)
    with caplog.at_level(logging.INFO, logger="rllm.training.verl.export"):
        assert final_model_dir(tmp_path, since=started - 1) == folder
        assert report_final_model(tmp_path) == folder
    assert f"serve it with `vllm serve {folder}`" in caplog.text
    assert model_files_missing(folder) == []
    assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == "qwen3"
    assert AutoTokenizer.from_pretrained(folder).chat_template  # the template the policy was trained with


def test_no_model_is_reported_where_the_run_exported_none(tmp_path: Path, caplog) -> None:
    assert final_model_dir(tmp_path) is None  # no checkpoint at all
    folder = _checkpoint(tmp_path, 2, weights=False)
    assert model_files_missing(folder) == ["weights (*.safetensors)"]
    with caplog.at_level(logging.WARNING, logger="rllm.training.verl.export"):
        assert final_model_dir(tmp_path) is None
        assert report_final_model(tmp_path) is None
    assert "add hf_model to actor_rollout_ref.actor.checkpoint.save_contents" in caplog.text
    assert "set trainer.save_freq > 0 and hf_model" in caplog.text
    # An earlier run's tracker (this run saved nothing) is not this run's model.
    _checkpoint(tmp_path, 3)
    now = time.time()
    os.utime(tmp_path / TRACKER, (now - 60, now - 60))
    assert final_model_dir(tmp_path, since=now) is None and final_model_dir(tmp_path) is not None
    # A folder without its chat template would not serve the agent's conversations.
    (tmp_path / "global_step_3" / "actor" / "huggingface" / "chat_template.jinja").unlink()
    assert final_model_dir(tmp_path) is None


def test_the_export_loads_in_the_precision_the_rollouts_were_sampled_in(tmp_path: Path) -> None:
    import json

    import torch
    from transformers import AutoModelForCausalLM

    folder = _checkpoint(tmp_path, 2)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "bfloat16"  # what verl 0.9.1 names over its fp32 weights
    config_path.write_text(json.dumps(config))
    trained = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert next(iter(AutoModelForCausalLM.from_pretrained(folder).parameters())).dtype == torch.bfloat16  # rounded
    # The launcher names the rollout's dtype (a CPU run's float32): the weights load exactly as trained.
    assert report_final_model(tmp_path, served_dtype="float32") == folder
    assert json.loads(config_path.read_text())["dtype"] == "float32"
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert all(torch.equal(loaded[name], trained[name]) for name in trained)
    from rllm.training.verl.export import set_served_dtype

    assert set_served_dtype(folder, "fp16") == "float16"  # the GPU recipe's rollout.dtype, as vLLM served it
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        set_served_dtype(folder, "int8")
