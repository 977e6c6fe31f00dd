"""Launch verl training from a Hydra recipe: compose, make paths absolute, validate, hand to verl's ``main``.

The default recipe is ``strands_hotpotqa_rloo.yaml``, shipped in this package's ``config/`` (the
Strands HotpotQA search agent: RLOO, Qwen3-4B, 8 GPUs, fp16; it extends verl's ``ppo_trainer``);
the agent runs inside verl as ``rllm.training.verl.agent_loop.StrandsAgentLoop``, which reads
its settings from the recipe. This script composes the recipe with any Hydra overrides, makes the
file paths in it absolute (Ray workers may not share this working directory), resolves it (so the
workers get values, not environment lookups), checks the agent loop's settings and hands it to
verl's own ``main``, which validates it and starts the trainer.

    python -m rllm.training.verl.train [--dry-run] [hydra overrides ...]

``--dry-run`` validates the composed config with verl's ``validate_config`` and the loop's
``loop_settings`` and prints it, resolved, without starting Ray, a GPU or the retrieval server.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(str(importlib.resources.files("rllm.training.verl") / "config"))
"""The shipped recipes (package data, so a normal install has them too)."""
CONFIG_NAME = "strands_hotpotqa_rloo"
DRY_RUN_FLAG = "--dry-run"
CPU_FLAG = "--cpu"
TOKEN_ENV = "RETRIEVAL_TOKEN"


def _absolute(path: str, *roots: Path) -> str:
    """``path`` made absolute: the first root under which it exists, else the first root."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return str(candidate)
    for root in roots:
        if (root / candidate).exists():
            return str((root / candidate).resolve())
    return str((roots[0] / candidate).resolve())


def prepare_config(config: DictConfig) -> DictConfig:
    """Resolve interpolations and make the data and agent-loop paths absolute, in place.

    Data files are relative to the working directory; the agent-loop registry to the working
    directory, else the shipped recipes' directory.
    """
    OmegaConf.resolve(config)
    cwd = Path.cwd()
    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        if agent.agent_loop_config_path:
            agent.agent_loop_config_path = _absolute(agent.agent_loop_config_path, cwd, CONFIG_DIR)
        for key in ("train_files", "val_files"):
            files = config.data[key]
            if isinstance(files, str):
                config.data[key] = _absolute(files, cwd)
            else:
                config.data[key] = [_absolute(f, cwd) for f in files]
    return config


def check_agent_loops(config: DictConfig) -> None:
    """Check the settings of every ``StrandsAgentLoop`` the registry names, as each worker will read them."""
    path = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    if not path:
        return
    from rllm.training.verl.agent_loop import StrandsAgentLoop, loop_settings

    target = f"{StrandsAgentLoop.__module__}.{StrandsAgentLoop.__qualname__}"
    entries = OmegaConf.to_container(OmegaConf.load(path))
    if any(isinstance(entry, dict) and entry.get("_target_") == target for entry in entries or []):
        loop_settings(config)


def _masked(config: DictConfig) -> DictConfig:
    """A copy of ``config`` with the retrieval token, if set, shown as ``***``."""
    shown = config.copy()
    env_vars = OmegaConf.select(shown, "ray_kwargs.ray_init.runtime_env.env_vars")
    if env_vars is not None and env_vars.get(TOKEN_ENV):
        env_vars[TOKEN_ENV] = "***"
    return shown


def validate(config: DictConfig) -> None:
    """Verl's own config checks, as ``verl.trainer.main_ppo.main`` runs them, and the agent loop's settings."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    check_agent_loops(config)


def _run(config: DictConfig, dry_run: bool) -> None:
    prepare_config(config)
    if dry_run:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict; stdout is the config only
            validate(config)
        print(OmegaConf.to_yaml(_masked(config), resolve=True), end="")
        logger.info("dry run: the config composes and passes verl's validation; nothing was started")
        return
    check_agent_loops(config)  # a bad setting fails here, not in every rollout worker
    from verl.trainer.main_ppo import main as verl_main

    # verl's main is a @hydra.main function; given a config it runs on it directly
    # (auto device selection, validate_config, then the v1 or v0 trainer on Ray).
    verl_main(config)


def main(argv: list[str] | None = None) -> None:
    """Entry point: strip ``--dry-run`` and let Hydra parse the rest of the command line."""
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = DRY_RUN_FLAG in args
    if CPU_FLAG in args:  # before verl is imported: its plugin reads the switch at import
        from rllm.training.verl.cpu import CPU_ENV, CPU_OVERRIDES

        os.environ.update(CPU_ENV)
        args = [*CPU_OVERRIDES, *args]
    args = [a for a in args if a not in (DRY_RUN_FLAG, CPU_FLAG)]
    if dry_run:  # print only: no Hydra output directory, log file or logging setup
        args += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=disabled",
                 "hydra/hydra_logging=disabled"]
    sys.argv = [sys.argv[0], *args]

    @hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)
    def _hydra_main(config: DictConfig) -> None:
        _run(config, dry_run)

    _hydra_main()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
