"""A LoRA run's export made whole: the merged model to serve, and the adapter in PEFT's own format beside it.

verl 0.9.1's ``hf_model`` checkpoint of a LoRA actor writes the peft model's state under peft's names
(``base_model.model.….base_layer.weight``, ``….lora_A.default.weight``) into a plain model's folder:
transformers then loads a randomly initialised model with a warning, and ``vllm serve`` refuses it.
``split_lora_export`` reads those tensors back into peft's own ``PeftModel`` (built from the export's
config, the rank and alpha verl records in ``lora_train_meta.json``, and the modules that hold an
adapter), writes the adapter with ``save_pretrained`` (``adapter_config.json``,
``adapter_model.safetensors``: what ``PeftModel.from_pretrained`` and ``vllm serve --enable-lora`` load)
and puts the merged model (``merge_and_unload``) in the export's place.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ADAPTER_SUBDIR = "lora_adapter"
"""The adapter's folder, beside the checkpoint's ``huggingface/`` under ``global_step_N/actor/``."""
LORA_META = "lora_train_meta.json"
"""verl's record of the adapter's rank and alpha, in ``global_step_N/actor/``."""
PEFT_PREFIX = "base_model.model."
_ADAPTER_NAME = "default"


def adapter_dir(model_dir: Path) -> Path | None:
    """The PEFT adapter exported beside ``model_dir`` (a checkpoint's ``huggingface/``); ``None`` without one."""
    path = model_dir.parent / ADAPTER_SUBDIR
    return path if (path / "adapter_config.json").is_file() else None


def _read_state(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def _target_modules(state: dict[str, Any], module_names: list[str]) -> list[str]:
    """The modules holding an adapter: by their last name where that picks exactly them, else by full name."""
    marker = f".lora_A.{_ADAPTER_NAME}.weight"
    adapted = sorted({key.removeprefix(PEFT_PREFIX).removesuffix(marker) for key in state if key.endswith(marker)})
    leaves = {name.rpartition(".")[2] for name in adapted}
    picked = [name for name in module_names if name.rpartition(".")[2] in leaves]
    return sorted(leaves) if sorted(picked) == adapted else adapted


def split_lora_export(model_dir: Path, base_model: str | None = None) -> Path | None:
    """Turn verl's LoRA ``hf_model`` export in ``model_dir`` into the merged model plus a PEFT adapter beside it.

    Returns the adapter's folder; ``None`` when the export holds no adapter (a full fine-tune: nothing
    to do) or was split already. ``base_model`` (the run's ``actor_rollout_ref.model.path``) is written
    as the adapter's ``base_model_name_or_path``.
    """
    if not any(model_dir.glob("*.safetensors")):
        return None
    state = _read_state(model_dir)
    if not any(key.startswith(PEFT_PREFIX) for key in state):
        return adapter_dir(model_dir)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rllm.errors import ConfigurationError

    meta_path = model_dir.parent / LORA_META
    if not meta_path.is_file():
        raise ConfigurationError(f"{model_dir} holds a LoRA actor's weights but verl wrote no {LORA_META} beside it "
                                 "(the adapter's rank and alpha): cannot rebuild the adapter")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    targets = _target_modules(state, [name for name, _ in model.named_modules()])
    lora = LoraConfig(r=int(meta["r"]), lora_alpha=int(meta["lora_alpha"]), target_modules=targets,
                      task_type="CAUSAL_LM", bias="none", base_model_name_or_path=base_model)
    peft_model = get_peft_model(model, lora)
    result = peft_model.load_state_dict(state, strict=False)
    tied = {f"{PEFT_PREFIX}{name}" for name in getattr(model, "_tied_weights_keys", None) or []}
    missing = [key for key in result.missing_keys if key not in tied]
    if missing or result.unexpected_keys:
        raise ConfigurationError(f"{model_dir}: the LoRA export does not fit the model its config describes "
                                 f"(missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})")
    adapter = model_dir.parent / ADAPTER_SUBDIR
    peft_model.save_pretrained(adapter)
    if base_model is not None:
        _name_base_model(adapter, base_model)
    merged = peft_model.merge_and_unload()
    for file in list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.safetensors.index.json")):
        file.unlink()
    merged.save_pretrained(model_dir)
    trainable = sum(tensor.numel() for key, tensor in state.items() if ".lora_" in key)
    logger.info("LoRA export: adapter (rank %s, alpha %s, %d parameters, modules %s) in %s; the merged model in %s",
                meta["r"], meta["lora_alpha"], trainable, ", ".join(targets[:8]), adapter, model_dir)
    return adapter


def _name_base_model(adapter: Path, base_model: str) -> None:
    config_path = adapter / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base_model
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
