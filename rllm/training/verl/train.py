"""Launch verl training from a Hydra recipe: compose, make paths absolute, validate, hand to verl's ``main``.

The default recipe is ``strands_hotpotqa_rloo.yaml``, shipped in this package's ``config/`` (the
Strands HotpotQA search agent: RLOO, Qwen3-4B, 8 GPUs, fp16; it extends verl's ``ppo_trainer``);
the agent runs inside verl as ``rllm.training.verl.agent_loop.StrandsAgentLoop``, which reads
its settings from the recipe. This script composes the recipe with any Hydra overrides, makes the
file paths in it absolute (Ray workers may not share this working directory), resolves it (so the
workers get values, not environment lookups), checks the agent loop's settings and hands it to
verl's own ``main``, which validates it and starts the trainer.

    python -m rllm.training.verl.train [--dry-run | --print-config] [--smoke] [--cpu] [hydra overrides ...]

``--dry-run`` validates the composed config with verl's ``validate_config`` and the launch checks,
tries the agent, its tools and its reward on the first training task (``preflight``), counts the tasks
against the batch and says the run's steps and whether it is new or resumes (``plan_launch``), and prints the
config, resolved, without starting Ray, a GPU or the retrieval server; ``--print-config`` only prints
it. Task files (JSON, JSONL, or parquet that is not verl rows) are written as verl rows under
``trainer.default_local_dir``. A real run first checks the retrieval servers the agent's tools search,
and only those. ``--smoke`` runs two real steps of the recipe on this machine and ``--cpu`` runs verl on
the CPU (``rllm.training.verl.cpu``): each selects a Hydra overlay of ``config/overlay/``
(``+overlay=smoke``, ``+overlay=[cpu,smoke]``), merged after the recipe and before the command line's
overrides. The trainer is verl's own, run by ``GuardedTaskRunner`` (trainer mode ``rllm_sync``): every
step logs the training guards and stops when one is violated. Ray is started by verl's own ``run_ppo``
(``start_ray``), after verl has set the environment the recipe asks for. The
retrieval server's token goes from this process's ``RETRIEVAL_TOKEN`` to the rollout workers
through a Ray actor (``rllm.training.verl.secrets``), never through the config verl prints and
tracks or the runtime environment Ray logs.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from rllm.errors import ConfigurationError

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(str(importlib.resources.files("rllm.training.verl") / "config"))
"""The shipped recipes (package data, so a normal install has them too)."""
CONFIG_NAME = "strands_hotpotqa_rloo"
DRY_RUN_FLAG = "--dry-run"
PRINT_FLAG = "--print-config"
CPU_FLAG = "--cpu"
SMOKE_FLAG = "--smoke"
OVERLAY_GROUP = "overlay"
"""The Hydra config group of overlays in ``config/overlay/``: ``+overlay=cpu``, ``+overlay=[cpu,smoke]``."""
SMOKE_OVERLAY = "smoke"
"""``--smoke``: ``config/overlay/smoke.yaml``, two real steps of the recipe on this machine (one GPU with the
embedded backend, or ``--cpu``), two prompts of two rollouts each, nothing saved or validated, so a broken tool,
reward, template or config shows before a cluster is rented. Overrides given after it still apply."""
SMOKE_OVERRIDES = [f"+{OVERLAY_GROUP}={SMOKE_OVERLAY}"]
"""The Hydra override that selects the smoke overlay (alone; with ``--cpu`` the launcher selects both at once)."""


def overlay_override(names: list[str]) -> list[str]:
    """The Hydra override that selects the overlays ``names`` in this order (none: no override).

    Hydra merges them after the recipe and before the command line's overrides, so the user's values win.
    """
    if not names:
        return []
    return [f"+{OVERLAY_GROUP}={names[0]}" if len(names) == 1 else f"+{OVERLAY_GROUP}=[{','.join(names)}]"]


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
    """Resolve interpolations, read the ``rllm:`` block and make the data and agent-loop paths absolute, in place.

    A value of the ``rllm:`` block that its reader refuses (``rllm.training.verl.settings``) stops here,
    before anything starts. Data files are relative to the working directory; the agent-loop registry to
    the working directory, else the shipped recipes' directory. Task files become verl rows (``_rows_files``).
    """
    from rllm.training.verl.settings import read_settings

    OmegaConf.resolve(config)
    settings = read_settings(config)
    to_prompt = _task_to_prompt(settings.agent_loop.task_to_prompt if settings.agent_loop else None)
    cwd = Path.cwd()
    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        if agent.agent_loop_config_path:
            agent.agent_loop_config_path = _absolute(agent.agent_loop_config_path, cwd, CONFIG_DIR)
        run_dir = Path(_absolute(str(config.trainer.default_local_dir), cwd))
        config.trainer.default_local_dir = str(run_dir)
        for key in ("train_files", "val_files"):
            files = config.data[key]
            if files is None:
                continue
            if isinstance(files, str):
                config.data[key] = _rows_files([_absolute(files, cwd)], run_dir, key, to_prompt)[0]
            else:
                config.data[key] = _rows_files([_absolute(f, cwd) for f in files], run_dir, key, to_prompt)
        if settings.reward_fn is not None and OmegaConf.select(config, "reward.num_workers", default=0):
            # The loop hands verl every kept rollout's score (reward.hand_to_verl), so verl never calls its reward
            # workers: each would be one more process importing verl and torch, for nothing.
            logger.info("rllm.reward_fn scores in the agent loop: verl's reward workers are not started "
                        "(reward.num_workers=0)")
            config.reward.num_workers = 0
    return config


def _task_to_prompt(path: str | None) -> Any:
    """The recipe's ``rllm.agent_loop.task_to_prompt`` function (``None``: the task's question)."""
    if path is None:
        return None
    from rllm.training.verl._dotted import import_object

    key = "rllm.agent_loop.task_to_prompt"
    try:
        function = import_object(path)
    except (ImportError, ConfigurationError) as error:
        raise ConfigurationError(f"{key}={path}: {error}") from None
    if not callable(function):
        raise ConfigurationError(f"{key}={path} is a {type(function).__name__}, not a function (task) -> user message")
    return function


def _rows_files(paths: list[str], run_dir: Path, key: str, task_to_prompt: Any = None) -> list[str]:
    """Each of ``paths`` (the files of ``data.<key>``) as verl rows, with row ids unique across the files.

    verl groups and traces rollouts by ``extra_info.index`` over the whole dataset it concatenates from
    the files, so two files numbered from 0 each would put two tasks in one group (the group audit stops
    the run). A task file is written as rows (``_rows_file``) numbered after the rows before it. Rows
    files given as they are (written by the user's own script) whose ids collide are refused naming both
    files, not renumbered: those ids are the user's, the ones they find their rollouts and traces by, and
    a copy renumbered under the run's directory would show them other ones; the fix is one line of
    their script.
    """
    written: list[str] = []
    owner: dict[int, str] = {}  # row id -> the file that holds it (only when there are several files)
    next_index = 0
    for i, path in enumerate(paths):
        name = key if len(paths) == 1 else f"{key}_{i}"
        rows_path, indices = _rows_file(path, run_dir, name, task_to_prompt, next_index, ids=len(paths) > 1)
        written.append(rows_path)
        for index in indices:
            if index in owner and owner[index] != path:
                raise ConfigurationError(f"data.{key}: {owner[index]} and {path} both hold the row with "
                                         f"extra_info.index={index}; verl groups rollouts by it, so two tasks "
                                         "would share a group: number the rows of each file after the last of "
                                         "the file before it")
            owner[index] = path
        next_index = max([next_index - 1, *indices]) + 1
    return written


def _row_ids(file: Path) -> list[int]:
    """The ``extra_info.index`` of every row of a verl rows file (rows without one are left out)."""
    import pyarrow.parquet as pq

    infos = pq.read_table(file, columns=["extra_info"]).column("extra_info").to_pylist()
    return [int(info["index"]) for info in infos if isinstance(info, dict) and info.get("index") is not None]


def _rows_file(path: str, run_dir: Path, name: str, task_to_prompt: Any = None, first_index: int = 0, *,
               ids: bool = False) -> tuple[str, list[int]]:
    """``path`` when it holds verl rows (or does not exist yet: verl says so); else its tasks written as rows.

    A task file (``.json``, ``.jsonl``, or parquet without verl's row columns) is written as verl rows
    (``rllm.data.verl_rows.task_rows``, the user message from ``task_to_prompt``, default the task's
    ``question``/``prompt``/``problem``), numbered from ``first_index``, under the run's directory, and that
    file replaces it in the config. Also returns the rows' ids: those written, or with ``ids`` a rows
    file's own.
    """
    from rllm.data.tasks import load_tasks
    from rllm.data.verl_rows import is_verl_rows, task_rows, write_parquet

    file = Path(path)
    if not file.is_file():
        return path, []
    if file.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        if is_verl_rows(pq.read_schema(file).names):
            return path, _row_ids(file) if ids else []
    split = "validation" if name.startswith("val") else "train"
    rows = task_rows(load_tasks(file, name=f"data.{name}"), split, task_to_prompt=task_to_prompt,
                     first_index=first_index)
    written = write_parquet(rows, run_dir / "data" / f"{name}.parquet")
    logger.info("data.%s: %d tasks of %s written as verl rows to %s", name, len(rows), file, written)
    return str(written), [row["extra_info"]["index"] for row in rows]


def check_launch(config: DictConfig) -> Any:
    """What would make the run not real, refused before Ray starts: every message names the key to change.

    Returns the agent's ``Preflight`` (``check_agent_loops``).
    """
    from rllm.training.verl.cpu import check_precision, cpu_mode
    from rllm.training.verl.prompt_fit import fit_prompts
    from rllm.training.verl.settings import read_settings
    from rllm.training.verl.trainer.guards import GUARDED_MODE
    from rllm.training.verl.verl_internals import check_verl_version

    check_verl_version(strict=True)
    fit_prompts(config)  # first: the checks below count the tasks that fit
    guards = read_settings(config).guards
    n = int(config.actor_rollout_ref.rollout.n)
    if guards.min_rollouts_per_group is not None and n < guards.min_rollouts_per_group:
        raise ConfigurationError(f"actor_rollout_ref.rollout.n={n}: RLOO's baseline leaves each rollout out of its "
                                 f"group's mean, so it needs at least {guards.min_rollouts_per_group} rollouts per "
                                 "prompt (a group of one is REINFORCE without a baseline)")
    if not OmegaConf.select(config, "trainer.use_v1", default=True):
        raise ConfigurationError("trainer.use_v1=false: the Strands agent loop, its manager and the guards run on "
                                 "verl's v1 trainer only")
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode")
    if mode != GUARDED_MODE:
        raise ConfigurationError(f"trainer.v1.trainer_mode={mode}: the launcher runs verl's synchronous trainer with "
                                 f"rllm's training guards, trainer.v1.trainer_mode={GUARDED_MODE}")
    bypass = OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False)
    if bypass and not OmegaConf.select(config, "actor_rollout_ref.rollout.calculate_log_probs", default=True):
        raise ConfigurationError("algorithm.rollout_correction.bypass_mode=true trains against the rollout's "
                                 "log-probs, which actor_rollout_ref.rollout.calculate_log_probs=false does not return")
    check_micro_batches(config)
    check_runtime_env(config)
    if guards.served_weights:
        check_served_weights(config)
    if cpu_mode():
        check_precision(config)
    checked = check_agent_loops(config)
    plan_launch(config, log=True)
    return checked


def plan_launch(config: DictConfig, *, log: bool = False) -> Any:
    """The run's size and start (``preflight.check_sizing``, ``preflight.plan_run``), refused before Ray when wrong.

    With ``log``, the launch log's two lines: tasks, batch, steps per epoch, total steps and when
    validation runs; then whether the run is new or resumes (``resuming from step N of M``).
    Returns the ``RunStart``.
    """
    from rllm.training.verl.preflight import check_sizing, plan_run

    sizing = check_sizing(config, log=log)
    start = plan_run(config, sizing)
    if log:
        logger.info("the run: %s", sizing.describe())
        logger.info("%s", start.describe())
    return start


def check_agent_loops(config: DictConfig) -> Any:
    """The user's agent, tools, reward and data tried on the first task, when the registry runs ``StrandsAgentLoop``.

    Returns the ``Preflight`` (``None`` for a registry without the loop).
    """
    path = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    if not path:
        return None
    from rllm.training.verl.agent_loop import StrandsAgentLoop
    from rllm.training.verl.preflight import preflight

    target = f"{StrandsAgentLoop.__module__}.{StrandsAgentLoop.__qualname__}"
    entries = OmegaConf.to_container(OmegaConf.load(path))
    if any(isinstance(entry, dict) and entry.get("_target_") == target for entry in entries or []):
        return preflight(config)
    return None


def check_served_weights(config: DictConfig) -> None:
    """Refuse a backend whose served weights rllm cannot read, and vLLM without what lets rllm ask its workers."""
    from rllm.training.verl.weights.engine_weights import VLLM_RPC_ENV
    from rllm.training.verl.weights.served_weights import READERS

    name = str(OmegaConf.select(config, "actor_rollout_ref.rollout.name"))
    if name not in READERS:
        raise ConfigurationError(f"actor_rollout_ref.rollout.name={name}: rllm compares the served weights with the "
                                 f"actor's after every sync for {list(READERS)} only; set "
                                 "rllm.guards.served_weights=false to train without that check")
    if uses_lora(config):
        _check_lora_served(config, name)
    env_vars = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    if name == "vllm" and str(env_vars.get(VLLM_RPC_ENV, os.environ.get(VLLM_RPC_ENV, ""))) != "1":
        raise ConfigurationError("actor_rollout_ref.rollout.name=vllm with rllm.guards.served_weights on: vLLM runs "
                                 f"rllm's fingerprint in its workers only with {VLLM_RPC_ENV}=1 (pickle between the "
                                 "engine's own processes); set "
                                 f"ray_kwargs.ray_init.runtime_env.env_vars.{VLLM_RPC_ENV}='1' as the vLLM recipe "
                                 "does, or rllm.guards.served_weights=false")


def uses_lora(config: DictConfig) -> bool:
    """Whether the actor trains a LoRA adapter (verl's keys ``model.lora_rank``, ``model.lora.rank``, an adapter)."""
    model = "actor_rollout_ref.model"
    rank = OmegaConf.select(config, f"{model}.lora.rank", default=0) or OmegaConf.select(
        config, f"{model}.lora_rank", default=0) or 0
    return int(rank) > 0 or OmegaConf.select(config, f"{model}.lora_adapter_path", default=None) is not None


def _check_lora_served(config: DictConfig, name: str) -> None:
    """A LoRA run's served weights are proven on the embedded backend serving base plus adapter (lora.merge=false)."""
    from rllm.training.verl.embedded import BACKEND_NAME

    if name != BACKEND_NAME:
        raise ConfigurationError(f"actor_rollout_ref.rollout.name={name} with a LoRA actor: rllm compares the served "
                                 f"LoRA adapter with the actor's on {BACKEND_NAME} only ({name} keeps adapters outside "
                                 "the weights rllm reads); set rllm.guards.served_weights=false to train without that "
                                 "check")
    if OmegaConf.select(config, "actor_rollout_ref.model.lora.merge", default=False):
        raise ConfigurationError(f"actor_rollout_ref.model.lora.merge=true: {BACKEND_NAME} serves base plus the "
                                 "adapter and compares both with the actor's after every sync; leave lora.merge at "
                                 "verl's default, false")


def check_micro_batches(config: DictConfig) -> None:
    """Refuse a fixed actor micro-batch that does not divide the rows a mini-batch puts on each GPU.

    verl's v1 actor takes mini-batches of ``ppo_mini_batch_size x rollout.n`` rows (a split rollout's
    samples are rows of their own; verl pads the step's rows to whole mini-batches) and asserts at the
    first update, minutes into the run, when a GPU's share is not whole micro-batches. verl checks this
    only for the deprecated ``ppo_micro_batch_size``.
    """
    actor = config.actor_rollout_ref.actor
    micro = OmegaConf.select(actor, "ppo_micro_batch_size_per_gpu")
    if OmegaConf.select(actor, "use_dynamic_bsz", default=False) or micro is None:
        return
    mini, n = int(actor.ppo_mini_batch_size), int(config.actor_rollout_ref.rollout.n)
    sequence_parallel = int(OmegaConf.select(actor, "ulysses_sequence_parallel_size", default=1) or 1)
    gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes) // sequence_parallel
    rows = mini * n
    if rows % gpus or (rows // gpus) % int(micro):
        raise ConfigurationError(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} does not divide the "
                                 f"{rows / gpus:g} rows an actor mini-batch puts on each of its {gpus} data-parallel "
                                 f"rank(s) (actor.ppo_mini_batch_size={mini} x rollout.n={n}): verl's actor would stop "
                                 "at the first update; choose a micro-batch that divides it, or set "
                                 "actor_rollout_ref.actor.use_dynamic_bsz=true")


def validate(config: DictConfig) -> Any:
    """Verl's own config checks, as ``verl.trainer.main_ppo.main`` runs them, then ``check_launch`` (its preflight)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return check_launch(config)


def check_runtime_env(config: DictConfig) -> None:
    """Refuse a secret in the recipe's Ray runtime env (``ray_kwargs.ray_init.runtime_env.env_vars``).

    verl prints the config and sends it to every tracker, and Ray writes the runtime env into its
    session logs. The retrieval token reaches the workers through ``rllm.training.verl.secrets`` instead.
    """
    from rllm.training.verl.secrets import SECRET_ENV_VARS

    env_vars = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    leaked = sorted(set(env_vars) & set(SECRET_ENV_VARS))
    if leaked:
        raise ConfigurationError(f"ray_kwargs.ray_init.runtime_env.env_vars.{leaked[0]} would print the secret with "
                                 f"the config, send it to every tracker and write it into Ray's logs: set {leaked[0]} "
                                 "in the environment of the launcher instead")


def start_ray(config: DictConfig) -> None:
    """Start Ray as verl's ``run_ppo`` does, with nothing to run yet, so the run's secrets can be shared first.

    ``run_ppo`` sets the environment the recipe asks for (``VERL_FULL_DETERMINISM``,
    ``VLLM_BATCH_INVARIANT``, ``PYTHONHASHSEED`` with ``rollout.full_determinism``) before it starts Ray
    with verl's runtime env and the recipe's ``ray_kwargs``, then runs its task runner. Given a runner
    that returns at once, it only starts Ray, exactly as verl would; the real run follows with Ray up.
    """
    import ray
    from verl.trainer.main_ppo import run_ppo

    @ray.remote(num_cpus=0)
    class _NothingToRun:
        """A task runner that returns at once: ``run_ppo`` has started Ray when it does."""

        def run(self, config: Any) -> None:
            return None

    run_ppo(config, task_runner_class=_NothingToRun)


def _run(config: DictConfig, dry_run: bool, print_only: bool = False) -> None:
    if print_only:  # the composed recipe, resolved, as written: nothing checked, converted or started
        OmegaConf.resolve(config)
        print(OmegaConf.to_yaml(config), end="")
        return
    prepare_config(config)
    if dry_run:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict; stdout is the config only
            validate(config)
        print(OmegaConf.to_yaml(config, resolve=True), end="")
        logger.info("dry run: the config composes and passes verl's validation; nothing was started")
        return
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from rllm.training.verl.preflight import check_retrieval, clear_earlier_run
    from rllm.training.verl.secrets import SECRET_ENV_VARS, share_secrets
    from rllm.training.verl.trainer.runner import GuardedTaskRunner

    # What verl's own main does (device selection, validation), then its run_ppo with the guarded task runner.
    auto_set_device(config)
    checked = validate(config)
    if checked is not None:  # the retrieval servers the agent's tools search, only those
        check_retrieval(checked.retrieval)
    start = plan_launch(config)
    clear_earlier_run(start)  # a new run: the earlier run's checkpoints, which verl would resume or mix with
    # verl's file logger (trainer.logger: file) writes the run's metrics into its directory unless told otherwise,
    # and its tensorboard logger its event files.
    run_dir = Path(config.trainer.default_local_dir)
    os.environ.setdefault("VERL_FILE_LOGGER_PATH", str(run_dir / "metrics.jsonl"))
    os.environ.setdefault("TENSORBOARD_DIR", str(run_dir / "tensorboard"))
    if any(os.environ.get(name) for name in SECRET_ENV_VARS) and not ray.is_initialized():
        start_ray(config)  # the secret store is an actor: Ray first (without secrets, run_ppo starts it)
    secrets = share_secrets()  # the retrieval token, for the rollout workers; held until the run ends
    started = time.time()
    try:
        with _earlier_metrics_kept(Path(os.environ["VERL_FILE_LOGGER_PATH"]), start.resume_step):
            run_ppo(config, task_runner_class=GuardedTaskRunner)
    finally:
        del secrets
        from rllm.training.curves import draw_run_curve

        draw_run_curve(run_dir, Path(os.environ["VERL_FILE_LOGGER_PATH"]), since=started)
    from rllm.training.verl.export import report_final_model

    report_final_model(run_dir, since=started, served_dtype=str(config.actor_rollout_ref.rollout.dtype),
                       base_model=str(config.actor_rollout_ref.model.path))


@contextlib.contextmanager
def _earlier_metrics_kept(path: Path, resume_step: int | None) -> Iterator[None]:
    """A resumed run's metrics file holds the earlier steps too (up to ``resume_step``), then the new ones.

    verl's file logger opens its file for writing, so a resumed run would start it empty; the earlier
    run's lines up to the step it resumes from are put back in front of what the resumed run wrote.
    """
    earlier: list[str] = []
    if resume_step is not None and path.is_file():
        import json

        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                if line.strip() and int(json.loads(line).get("step", resume_step + 1)) <= resume_step:
                    earlier.append(line)
    try:
        yield
    finally:
        if earlier:
            written = path.read_text(encoding="utf-8") if path.is_file() else ""
            path.write_text("\n".join(earlier) + "\n" + written, encoding="utf-8")


USAGE = f"""usage: python -m rllm.training.verl.train [{DRY_RUN_FLAG} | {PRINT_FLAG}] [{SMOKE_FLAG}] [{CPU_FLAG}]
                                          [--config-name NAME] [--config-dir DIR] [hydra overrides ...]

Runs verl's own trainer (RLOO, rllm's guards) on a recipe; the default is {CONFIG_NAME}, your own agent's
is strands_agent_rloo (rllm.agent_loop.agent_factory, rllm.reward_fn, data.train_files):
  {DRY_RUN_FLAG}        check everything before Ray starts (the agent, its tools and reward on the first task) and
                   print the resolved config; start nothing
  {PRINT_FLAG}   print the composed config only
  {SMOKE_FLAG}          two real steps of two prompts x two rollouts on this machine (+overlay=smoke)
  {CPU_FLAG}            run verl on the CPU (fp32, FSDP2, gloo; +overlay=cpu)
  --config-name    a recipe shipped in rllm/training/verl/config, or one in --config-dir
  --config-dir     a folder with your own recipe (AgentTrainer writes agent_trainer.yaml into the run's folder)
Hydra's own help follows.
"""


_HYDRA_OPTIONS = ("--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp")


def _hydra_options(args: list[str]) -> tuple[list[str], list[str]]:
    """Hydra's recipe options (``--config-name NAME``, ``--config-dir=DIR``, ...) apart from the overrides."""
    options: list[str] = []
    overrides: list[str] = []
    items = iter(args)
    for arg in items:
        if arg in _HYDRA_OPTIONS:
            options += [arg, next(items, "")]
        elif arg.split("=", 1)[0] in _HYDRA_OPTIONS:
            options.append(arg)
        else:
            overrides.append(arg)
    return options, overrides


VERL_CONFIG_SOURCE = "pkg://verl.trainer.config"
"""The shipped recipes' Hydra search path: verl's own config package."""


def _verl_config_by_file(options: list[str], overrides: list[str]) -> list[str]:
    """``hydra.searchpath`` naming verl's config folder by file, for a recipe that names it by package.

    Hydra reads a ``pkg://`` source by importing its package, and ``import verl`` costs about 6 CPU-seconds
    (it loads torch, transformers and tensordict). ``--help`` and ``--print-config`` need only the YAML: the
    same folder by ``file://`` composes the same config (test_train.py::
    test_a_recipe_composes_the_same_with_verls_config_folder_named_by_file checks it, for the shipped recipes
    and the one ``AgentTrainer`` writes into its run folder) without that import. Only a recipe whose search
    path is verl's config package alone is changed; nothing for another search path or one on the command line.
    """
    import importlib.util

    folder, name, items = CONFIG_DIR, CONFIG_NAME, iter(options)
    for option in items:
        key, _, value = option.partition("=")
        if key in ("--config-name", "-cn"):
            name = value or next(items, "")
        elif key in ("--config-dir", "-cd"):
            folder = Path(value or next(items, ""))
        else:
            return []  # an option this does not read
    if any(o.split("=", 1)[0].lstrip("+~") == "hydra.searchpath" for o in overrides):
        return []
    recipe = folder / f"{name}.yaml"
    spec = importlib.util.find_spec("verl")
    if not recipe.is_file() or spec is None or not spec.submodule_search_locations:
        return []
    if OmegaConf.select(OmegaConf.load(recipe), "hydra.searchpath") != [VERL_CONFIG_SOURCE]:
        return []
    verl_folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return [f"hydra.searchpath=[file://{verl_folder}]"] if verl_folder.is_dir() else []


def flag_overlays(args: list[str]) -> list[str]:
    """The overlays the launcher's flags select, in the order Hydra merges them: ``--cpu``'s, then ``--smoke``'s."""
    from rllm.training.verl.cpu import CPU_OVERLAY

    return [name for flag, name in ((CPU_FLAG, CPU_OVERLAY), (SMOKE_FLAG, SMOKE_OVERLAY)) if flag in args]


def main(argv: list[str] | None = None) -> None:
    """Entry point: strip ``--dry-run`` and let Hydra parse the rest of the command line."""
    args = list(sys.argv[1:] if argv is None else argv)
    asks_help = "--help" in args or "-h" in args
    if asks_help:
        print(USAGE)  # then Hydra's help, which exits
    print_only = PRINT_FLAG in args
    dry_run = DRY_RUN_FLAG in args or print_only
    flags = (DRY_RUN_FLAG, PRINT_FLAG, CPU_FLAG, SMOKE_FLAG)
    options, overrides = _hydra_options([a for a in args if a not in flags])
    if SMOKE_FLAG in args and CPU_FLAG not in args and not dry_run:
        import torch

        if not torch.cuda.is_available():
            sys.exit(f"{SMOKE_FLAG}: no GPU here; add {CPU_FLAG} to run the smoke steps on the CPU")
    if CPU_FLAG in args:  # before verl is imported: its plugin reads the switch at import
        from rllm.training.verl.cpu import cpu_environment

        os.environ.update(cpu_environment())
    overrides = [*overlay_override(flag_overlays(args)), *overrides]
    args = [*options, *overrides]  # Hydra's options first: argparse takes no option between the overrides
    if print_only or asks_help:  # the YAML only: verl is not imported for it
        args += _verl_config_by_file(options, overrides)
    if dry_run:  # print only: no Hydra output directory or log file; logging left as the caller set it up
        # (Hydra's "disabled" would disable every logger already made, in this process: a dry run's own lines,
        # the sizing and the dropped tasks, would never show.)
        args += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    sys.argv = [sys.argv[0], *args]

    @hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)
    def _hydra_main(config: DictConfig) -> None:
        _run(config, dry_run, print_only)

    _hydra_main()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
