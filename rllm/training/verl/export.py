"""The model a run leaves: verl's Hugging Face export of the policy at its last checkpoint.

verl 0.9.1 saves the actor at every ``trainer.save_freq`` steps and at the last step (only when
``save_freq > 0``) under ``trainer.default_local_dir/global_step_N/actor/``; with ``hf_model`` in
``actor_rollout_ref.actor.checkpoint.save_contents`` that folder's ``huggingface/`` holds the whole
policy in safetensors with its config, tokenizer and chat template, the layout transformers loads and
``vllm serve`` serves. ``trainer.max_actor_ckpt_to_keep`` bounds how many ``actor/`` folders stay.
After each save verl writes the step into ``latest_checkpointed_iteration.txt``; ``final_model_dir``
reads it. verl names ``bfloat16`` in the export's config whatever the weights are (fp32 master weights);
``set_served_dtype`` writes there the precision the rollouts were sampled in instead, so the model loads
and serves as it was sampled in training.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
"""verl's record of the last checkpointed step, in ``trainer.default_local_dir``."""
HF_SUBDIR = Path("actor") / "huggingface"
"""Where a checkpoint's Hugging Face export is, under ``global_step_N/``."""


def model_files_missing(path: Path) -> list[str]:
    """What a Hugging Face model folder lacks to be loaded and served: weights, config, tokenizer, chat template."""
    missing = []
    if not any(path.glob("*.safetensors")):
        missing.append("weights (*.safetensors)")
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not (path / "tokenizer_config.json").is_file() or not any(
            (path / name).is_file() for name in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        missing.append("tokenizer (tokenizer_config.json with tokenizer.json)")
    if not (path / "chat_template.jinja").is_file() and '"chat_template"' not in _read(path / "tokenizer_config.json"):
        missing.append("chat template (chat_template.jinja)")
    return missing


def final_model_dir(run_dir: Path, *, since: float | None = None) -> Path | None:
    """The Hugging Face export of the last checkpoint verl recorded in ``run_dir``; ``None`` when there is none.

    Args:
        run_dir: The run's ``trainer.default_local_dir``.
        since: A time (``time.time()``) the tracker must have been written at or after, so a run that
            saved nothing does not report an earlier run's model in the same folder.
    """
    tracker = run_dir / TRACKER
    if not tracker.is_file() or (since is not None and tracker.stat().st_mtime < since):
        return None
    step = tracker.read_text(encoding="utf-8").strip()
    if not step.isdigit():
        return None
    path = run_dir / f"global_step_{step}" / HF_SUBDIR
    if not path.is_dir():
        return None
    missing = model_files_missing(path)
    if missing:
        logger.warning("the checkpoint of step %s (%s) has no Hugging Face model: %s missing; add hf_model to "
                       "actor_rollout_ref.actor.checkpoint.save_contents", step, path, ", ".join(missing))
        return None
    return path


_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float32": "float32", "fp32": "float32", "float": "float32"}


def set_served_dtype(path: Path, dtype: str) -> str:
    """Name ``dtype`` (the rollout's, ``actor_rollout_ref.rollout.dtype``) in the export's ``config.json``; the name.

    verl 0.9.1 writes the actor's weights as it holds them (fp32 master weights) under a config that names
    ``bfloat16``: transformers (``dtype="auto"``) would load them rounded to bf16 and ``vllm serve`` would
    serve bf16, neither the weights trained nor the precision the policy was sampled in during training.
    """
    name = _DTYPES.get(str(dtype).removeprefix("torch."))
    if name is None:
        raise ValueError(f"unknown dtype {dtype!r}: one of {sorted(_DTYPES)}")
    config_path = path / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("dtype") != name or config.get("torch_dtype", name) != name:
        logger.info("%s: dtype %s (the rollout's) in place of verl's %s", config_path, name, config.get("dtype"))
        config["dtype"] = name
        if "torch_dtype" in config:
            config["torch_dtype"] = name
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return name


def report_final_model(run_dir: Path, *, since: float | None = None, served_dtype: str | None = None,
                       base_model: str | None = None) -> Path | None:
    """Log where the run's final policy is as a Hugging Face model (or that it exported none, and which keys do).

    A LoRA run's export is split first into the merged model and the PEFT adapter beside it
    (``rllm.training.verl.lora_export``; ``base_model``: the run's ``actor_rollout_ref.model.path``). With
    ``served_dtype`` (the rollout's dtype), the export's config names it (``set_served_dtype``).
    """
    model = final_model_dir(run_dir, since=since)
    if model is None:
        logger.warning("this run exported no Hugging Face model: set trainer.save_freq > 0 and hf_model in "
                       "actor_rollout_ref.actor.checkpoint.save_contents (the shipped recipes do)")
        return None
    from rllm.training.verl.lora_export import split_lora_export

    adapter = split_lora_export(model, base_model)
    if served_dtype is not None:
        set_served_dtype(model, served_dtype)
    logger.info("the final policy as a Hugging Face model: %s (transformers loads it; serve it with "
                "`vllm serve %s`)", model, model)
    if adapter is not None:
        logger.info("the LoRA adapter (PEFT): %s (PeftModel.from_pretrained(base, path) loads it; serve it with "
                    "`vllm serve %s --enable-lora --lora-modules policy=%s`)", adapter, base_model or "BASE", adapter)
    return model


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""

