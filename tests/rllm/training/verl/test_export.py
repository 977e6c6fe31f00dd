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


def _lora_checkpoint(run_dir: Path, step: int) -> tuple[Path, object]:
    """``run_dir`` as verl 0.9.1 leaves a LoRA actor's checkpoint, and the trained peft model.

    verl's ``FSDPCheckpointManager.save_checkpoint`` writes the peft model's full state dict (peft's names)
    through a plain model's ``save_pretrained(state_dict=...)``, and ``lora_train_meta.json`` beside it.
    """
    import json

    import torch
    from peft import LoraConfig, get_peft_model

    folder = _checkpoint(run_dir, step)
    base_dir = run_dir / "base"
    build_tiny_qwen3(build_tiny_tokenizer()).save_pretrained(base_dir)
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                                LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    AutoModelForCausalLM.from_config(peft_model.config).save_pretrained(folder, state_dict=peft_model.state_dict())
    (folder.parent / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8,
                                                                     "task_type": "CAUSAL_LM"}))
    return folder, peft_model


def test_a_lora_export_becomes_the_merged_model_with_the_peft_adapter_beside_it(tmp_path: Path, caplog) -> None:
    import json

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rllm.training.verl.lora_export import adapter_dir

    folder, trained = _lora_checkpoint(tmp_path, 2)
    with caplog.at_level(logging.WARNING):
        AutoModelForCausalLM.from_pretrained(folder)  # verl's export as it is: peft's names in a plain model
    assert "base_model.model." in caplog.text  # transformers could not place them

    assert report_final_model(tmp_path, served_dtype="float32", base_model=str(tmp_path / "base")) == folder
    adapter = adapter_dir(folder)
    assert adapter == folder.parent / "lora_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8, str(tmp_path / "base"))
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    ids = torch.tensor([[5, 17, 42, 7]])
    with torch.no_grad():
        expected = trained(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
        base_logits = base(ids).logits
        loaded = PeftModel.from_pretrained(base, adapter)(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(folder)(ids).logits
    assert torch.equal(loaded, expected) and not torch.allclose(loaded, base_logits)  # the adapter is the trained one
    assert torch.allclose(merged, expected, atol=1e-5)  # and the merged model serves the same policy
    assert report_final_model(tmp_path) == folder and adapter_dir(folder) == adapter  # done once


def test_a_lora_export_without_verls_rank_record_is_refused(tmp_path: Path) -> None:
    from rllm.errors import ConfigurationError
    from rllm.training.verl.lora_export import split_lora_export

    folder, _ = _lora_checkpoint(tmp_path, 1)
    (folder.parent / "lora_train_meta.json").unlink()
    with pytest.raises(ConfigurationError, match="holds a LoRA actor's weights but verl wrote no lora_train_meta.json"):
        split_lora_export(folder)
