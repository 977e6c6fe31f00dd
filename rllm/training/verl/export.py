"""The model a run leaves: verl's Hugging Face export of the policy at its last checkpoint.

verl 0.9.1 saves the actor at every ``trainer.save_freq`` steps and at the last step (only when
``save_freq > 0``) under ``trainer.default_local_dir/global_step_N/actor/``; with ``hf_model`` in
``actor_rollout_ref.actor.checkpoint.save_contents`` that folder's ``huggingface/`` holds the whole
policy in safetensors with its config, tokenizer and chat template, the layout transformers loads and
``vllm serve`` serves. ``trainer.max_actor_ckpt_to_keep`` bounds how many ``actor/`` folders stay.
After each save verl writes the step into ``latest_checkpointed_iteration.txt``; ``final_model_dir``
reads it.
"""

from __future__ import annotations

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


def report_final_model(run_dir: Path, *, since: float | None = None) -> Path | None:
    """Log where the run's final policy is as a Hugging Face model (or that it exported none, and which keys do)."""
    model = final_model_dir(run_dir, since=since)
    if model is None:
        logger.warning("this run exported no Hugging Face model: set trainer.save_freq > 0 and hf_model in "
                       "actor_rollout_ref.actor.checkpoint.save_contents (the shipped recipes do)")
    else:
        logger.info("the final policy as a Hugging Face model: %s (transformers loads it; serve it with "
                    "`vllm serve %s`)", model, model)
    return model


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""

