"""What a run needs from the user's code and data, tried once before Ray starts (the launcher; ``--dry-run`` too).

A misspelled factory, a reward that returns the wrong type or a task file without the fields the
prompt needs would otherwise surface minutes into a run, once Ray and verl's workers are up. So
the launcher reads the ``rllm`` block (every key known), imports what it names, reads the first
training row, builds the agent for it exactly as a rollout worker will (the factory called on the
task, with a model that refuses to generate), scores an empty answer with the reward, and finds the
retrieval servers the agent's tools search. Each failure names the key (a ``ConfigurationError``, as
``rllm.training.verl.settings`` raises for the block's own values).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rllm.errors import ConfigurationError
from rllm.integrations.strands import Budget, RLLMModel
from rllm.integrations.strands.rollout import built_agents
from rllm.integrations.strands.runner import build_rollout
from rllm.rewards.base import score_answer
from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV
from rllm.training.verl._dotted import import_object
from rllm.training.verl.agent_loop import (
    SETTINGS_KEY,
    LoopSettings,
    agent_choice,
    build_tools,
    loop_settings,
    row_task_or_row,
    split_prompt,
)
from rllm.training.verl.reward import LEGACY_REWARD_PATH, LEGACY_SCORER_KEY
from rllm.training.verl.settings import BLOCK_KEY, REWARD_KEY, RllmSettings, read_settings
from rllm.types import ModelOutput

logger = logging.getLogger(__name__)

RLLM_KEYS = tuple(spec.name for spec in dataclasses.fields(RllmSettings))
"""The keys of the recipe's ``rllm`` block (``rllm.training.verl.settings``); any other is refused."""
REWARD_PATH_KEY = "reward.custom_reward_function.path"


@dataclass
class Preflight:
    """What the launcher learned from the user's code before starting anything.

    Attributes:
        settings: The agent loop's settings, as every rollout worker reads them.
        task: The first training task, as the factory and the reward get it.
        tool_names: The tools of the agent built for it.
        retrieval: ``(base_url, token)`` of each retrieval server its tools search (checked before a real run).
    """

    settings: LoopSettings
    task: dict[str, Any]
    tool_names: list[str] = field(default_factory=list)
    retrieval: list[tuple[str, str | None]] = field(default_factory=list)


class _NoGeneration:
    """The engine behind the preflight's model: building an agent must not call the model."""

    async def get_model_response(self, messages: list[dict[str, Any]], tools: Any = None,
                                 **sampling: Any) -> ModelOutput:
        raise ConfigurationError("the agent factory called the model while building the agent (before training "
                                 "started); build the agent only, the rollout runs it")


def check_rllm_block(config: Any) -> None:
    """Refuse a recipe without the ``rllm`` block, or a value of it that ``read_settings`` refuses."""
    if OmegaConf.select(config, BLOCK_KEY, default=None) is None:
        raise ConfigurationError(f"the recipe has no rllm block ({', '.join(RLLM_KEYS)}); start from "
                                 "strands_agent_rloo.yaml")
    read_settings(config)


def first_row(config: Any) -> dict[str, Any]:
    """The first row of the first training file (verl rows: the launcher has written any task file as rows)."""
    files = OmegaConf.select(config, "data.train_files", default=None)
    if not files:
        raise ConfigurationError("data.train_files is not set: name your task files (.json, .jsonl or .parquet)")
    path = Path(files if isinstance(files, str) else files[0])
    if not path.is_file():
        raise ConfigurationError(f"data.train_files: no file {path}")
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1):
        rows = batch.to_pylist()
        if rows:
            return rows[0]
    raise ConfigurationError(f"data.train_files: {path} has no rows")


def _import(key: str, path: str) -> Any:
    try:
        return import_object(path)
    except (ImportError, ConfigurationError) as error:
        raise ConfigurationError(f"{key}={path}: {error}") from None


@contextlib.contextmanager
def policy_env_restored() -> Iterator[None]:
    """The policy endpoint's variables (``RLLM_POLICY_*``) put back as they were on leaving.

    Ray's workers inherit the launcher's environment: a placeholder or a measuring server's address must not
    reach them.
    """
    saved = {name: os.environ.get(name) for name in (BASE_URL_ENV, API_KEY_ENV, MODEL_ENV)}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _policy_placeholder(own_client: bool) -> Iterator[None]:
    """With ``own_client``, a policy endpoint for the factory to read (never called: nothing runs here)."""
    if not own_client:
        yield
        return
    with policy_env_restored():
        os.environ.update({BASE_URL_ENV: "http://127.0.0.1:9/v1", API_KEY_ENV: "preflight", MODEL_ENV: "policy"})
        yield


def preflight(config: Any) -> Preflight:
    """Try the run's agent, tools and reward on its first training task; ``ConfigurationError`` naming what fails."""
    check_rllm_block(config)
    settings = loop_settings(config)  # its own errors name the key (ConfigurationError)
    _check_reward_source(config, settings)
    row = first_row(config)
    # As verl's worker passes a row to the loop: its prompt as raw_prompt, in the first session of its group.
    task = row_task_or_row({**row, "raw_prompt": row.get("prompt"), "session_id": 0})
    model = RLLMModel(_NoGeneration())
    if settings.block.agent_factory is not None:
        _import(f"{SETTINGS_KEY}.agent_factory", settings.block.agent_factory)
        with _policy_placeholder(settings.block.own_client):  # built, recorded and checked as a rollout worker does
            built = build_rollout(agent_choice(settings), model, task, where="the first training task").built
        tools = [tool for agent in built_agents(built) for tool in agent.tool_registry.registry.values()]
    else:
        assert settings.block.tool_factory is not None
        _import(f"{SETTINGS_KEY}.tool_factory", settings.block.tool_factory)
        try:
            tools = build_tools(settings.block.tool_factory, settings.block.tool_kwargs)
        except Exception as error:
            raise ConfigurationError(f"{SETTINGS_KEY}.tool_factory={settings.block.tool_factory} raised "
                                     f"({type(error).__name__}: {error})") from error
        system, _ = split_prompt(row["prompt"])
        if system is None and settings.block.system_prompt is None:
            raise ConfigurationError(f"the training rows carry no system message and {SETTINGS_KEY}.system_prompt "
                                     "is null: the agent built from tool_factory would have no instructions")
    if settings.reward_fn is not None:
        reward_fn = _import(REWARD_KEY, settings.reward_fn)
        try:
            asyncio.run(score_answer(reward_fn, task, ""))
        except ConfigurationError as error:
            raise ConfigurationError(f"{REWARD_KEY}={settings.reward_fn}: {error}") from error
        except Exception as error:
            raise ConfigurationError(f"{REWARD_KEY}={settings.reward_fn} raised on the first training task with an "
                                     f"empty answer ({type(error).__name__}: {error}); a rollout that answers "
                                     "nothing is scored the same way") from error
    names = [str(getattr(tool, "tool_name", getattr(tool, "name", type(tool).__name__))) for tool in tools]
    retrieval = _retrieval_servers(tools)
    _log_budget(config, settings.budget)
    return Preflight(settings=settings, task=task, tool_names=names, retrieval=retrieval)


def _check_reward_source(config: Any, settings: LoopSettings) -> None:
    """One reward scores the rollouts: ``rllm.reward_fn`` (the loop hands verl its score), or a verl reward function.

    verl calls no reward function for an output the loop scored, so a recipe naming both would
    silently drop its own; a recipe naming neither would be scored by verl's default by data source.
    """
    scorer = OmegaConf.select(config, LEGACY_SCORER_KEY, default=None)
    path = OmegaConf.select(config, REWARD_PATH_KEY, default=None)
    move = (f"the loop scores with {REWARD_KEY} and hands verl the score: delete the reward.custom_reward_function "
            f"block and name the scorer as {REWARD_KEY} (module:function scoring (task, final_answer), returning "
            "a RewardOutput or a number, as StrandsWorkflow's reward_fn)")
    if scorer:
        both = f"{REWARD_KEY} and {LEGACY_SCORER_KEY} are both set; one reward scores the rollouts, and " \
            if settings.reward_fn is not None else f"{LEGACY_SCORER_KEY}={scorer}: "
        raise ConfigurationError(f"{both}rllm reads no scorer there any more: {move}")
    if path == LEGACY_REWARD_PATH:
        raise ConfigurationError(f"{REWARD_PATH_KEY}={path} is gone: {move}")
    if settings.reward_fn is not None and path:
        raise ConfigurationError(f"{REWARD_KEY} and {REWARD_PATH_KEY}={path} are both set; one reward scores the "
                                 f"rollouts, and verl calls no reward function for a rollout the loop scored: set "
                                 f"{REWARD_KEY}=null to score with {path}, or delete the reward.custom_reward_function "
                                 "block")
    if settings.reward_fn is None and not path:
        raise ConfigurationError(f"no reward: set {REWARD_KEY} (module:function scoring (task, final_answer), as "
                                 "StrandsWorkflow's reward_fn)")


def _retrieval_servers(tools: list[Any]) -> list[tuple[str, str | None]]:
    """The retrieval servers the tools search (``rag.client.make_local_search_tool`` keeps its client)."""
    from rag.client import RetrievalClient

    servers = []
    for tool in tools:
        client = getattr(tool, "client", None)
        if isinstance(client, RetrievalClient) and (client.base_url, client.token) not in servers:
            servers.append((client.base_url, client.token))
    return servers


def _log_budget(config: Any, budget: Budget) -> None:
    source = OmegaConf.select(config, f"{SETTINGS_KEY}.budget", default=None)
    where = f"{SETTINGS_KEY}.budget={source}" if source is not None else f"{SETTINGS_KEY}.budget unset: the defaults"
    logger.info("each rollout's budget: %s (%s)", budget, where)


def check_retrieval(servers: list[tuple[str, str | None]]) -> None:
    """One authenticated search on each server the agent's tools use; ``ConfigurationError`` saying how to fix it."""
    from rag.client import check_search
    from rag.errors import RetrievalError

    for base_url, token in servers:
        try:
            asyncio.run(check_search(base_url, token))
        except RetrievalError as error:
            raise ConfigurationError(
                f"the agent's local_search cannot search {base_url}: {error}; start the server with "
                "`bash rag/launch_rag.sh` (or set RETRIEVAL_SERVER_URL, and RETRIEVAL_TOKEN if it needs one); "
                "training would drop or fail every rollout") from None
        logger.info("retrieval server OK at %s (an authenticated search)", base_url)


# ---------------------------------------------------------------- the run's size, and whether it is new


TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""verl's tracker of the last checkpointed step, in ``trainer.default_local_dir`` (``find_latest_ckpt_path``)."""
CHECKPOINT_PREFIX = "global_step_"
"""verl's checkpoint folders: ``global_step_N`` in ``trainer.default_local_dir``."""
MODEL_SHARD_PREFIX = "model_world_size_"
"""verl's FSDP checkpoint manager's model shards in ``global_step_N/actor/`` (``model_world_size_W_rank_R.pt``): what
a resume loads the weights from. A checkpoint saved with ``save_contents=[hf_model]`` (the smoke overlay's) has none,
and verl then resumes the step count on the base model's weights, saying nothing."""
RESUME_MODES = ("auto", "disable", "resume_path")
"""verl 0.9.1's ``trainer.resume_mode`` values (``PPOTrainerBase._load_checkpoint``)."""


@dataclass(frozen=True)
class Sizing:
    """The run's size as verl's trainer will compute it (``PPOTrainerBase._init_dataloader`` and ``fit``).

    Attributes:
        train_tasks: Rows of every ``data.train_files`` file (capped by ``data.train_max_samples``).
        val_tasks: Rows of every ``data.val_files`` file (capped by ``data.val_max_samples``).
        batch: ``data.train_batch_size``, prompts per step.
        mini_batch: ``actor_rollout_ref.actor.ppo_mini_batch_size``, prompts per optimizer update.
        rollouts: ``actor_rollout_ref.rollout.n``, rollouts per prompt.
        steps_per_epoch: Whole batches in the training tasks (verl drops the incomplete one).
        total_steps: The step the run ends at: ``trainer.total_training_steps``, bounded by
            ``trainer.total_epochs`` epochs.
        validation: When validation runs, in words.
    """

    train_tasks: int
    val_tasks: int
    batch: int
    mini_batch: int
    rollouts: int
    steps_per_epoch: int
    total_steps: int
    validation: str

    def describe(self) -> str:
        """The launch log's line."""
        updates = -(-self.batch // self.mini_batch)
        return (f"{self.train_tasks} training tasks, {self.val_tasks} validation tasks; data.train_batch_size="
                f"{self.batch} prompts x rollout.n={self.rollouts} per step ({updates} optimizer update(s) of "
                f"ppo_mini_batch_size={self.mini_batch}); {self.steps_per_epoch} steps per epoch, "
                f"{self.total_steps} steps in all; validation: {self.validation}")


def _file_rows(files: Any, key: str) -> int:
    """Rows of every file of ``data.<key>`` (verl rows parquet, or a task file the launcher did not convert)."""
    if files is None:
        return 0
    total = 0
    for path in [files] if isinstance(files, str) else list(files):
        file = Path(path)
        if not file.is_file():
            raise ConfigurationError(f"data.{key}: no file {file}")
        if file.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(file).metadata.num_rows
        else:
            from rllm.data.tasks import load_tasks

            total += len(load_tasks(file, name=f"data.{key}"))
    return total


def _capped(rows: int, cap: Any) -> int:
    """``rows`` after verl's ``max_samples`` (``RLHFDataset``: a positive cap below the rows keeps that many)."""
    return int(cap) if cap is not None and 0 < int(cap) < rows else rows


def check_sizing(config: Any, *, log: bool = True) -> Sizing:
    """Count the tasks and refuse a run that would train no step, before Ray starts; the run's ``Sizing``.

    verl 0.9.1's trainer (``PPOTrainerBase._init_dataloader``) loads the training rows with
    ``drop_last=True`` and computes ``steps_per_epoch = len(train_dataset) // data.train_batch_size``;
    with fewer tasks than one batch that is 0, the dataloader has no batch, and the run dies minutes in,
    after Ray and the workers started, on ``ZeroDivisionError`` (``global_steps // steps_per_epoch`` in
    ``fit``). Refused here instead, naming the numbers and the fix; the batch is not fitted to the tasks,
    because the batch sets how many prompts each update averages over and the learning rate is tuned for
    it: a quietly smaller batch is another experiment than the one the recipe describes. Tasks past the
    last whole batch of an epoch are dropped by verl, as said in the log.

    The total mirrors verl's too: ``trainer.total_training_steps`` when set, else ``steps_per_epoch x
    trainer.total_epochs``; ``fit`` also stops after ``trainer.total_epochs`` epochs, so the run ends at
    the smaller. ``ppo_mini_batch_size`` need not divide the batch: verl pads a step's rows to whole
    mini-batches with no-op rows (``upsample_batch_to_divisible_size``: no loss), and refuses a
    mini-batch larger than the batch only without ``use_dynamic_bsz`` (``ActorConfig.validate``); a
    mini-batch that does not divide the batch is said in a warning, since its last update then
    averages over fewer prompts. Validation needs ``data.val_files`` when it runs. Rows verl's length
    filter (``data.filter_overlong_prompts``) drops are not counted here. ``log``: say those notes (the
    launch checks do; the launcher's second reading of the size before Ray does not repeat them).
    """
    data = config.data
    train = _capped(_file_rows(data.train_files, "train_files"), OmegaConf.select(data, "train_max_samples"))
    val = _capped(_file_rows(OmegaConf.select(data, "val_files"), "val_files"),
                  OmegaConf.select(data, "val_max_samples"))
    batch = int(data.train_batch_size)
    actor = config.actor_rollout_ref.actor
    mini, n = int(actor.ppo_mini_batch_size), int(config.actor_rollout_ref.rollout.n)
    if train < batch:
        raise ConfigurationError(
            f"{train} training task(s), fewer than data.train_batch_size={batch}: verl's dataloader drops the "
            f"incomplete batch and would train no step; set data.train_batch_size<={train} (and "
            f"actor_rollout_ref.actor.ppo_mini_batch_size<=it, dividing it), or give more tasks")
    if batch % mini and log:
        logger.warning("actor_rollout_ref.actor.ppo_mini_batch_size=%d does not divide data.train_batch_size=%d: "
                       "verl pads each step's last optimizer update with no-op rows, so that update averages over "
                       "%d prompt(s)", mini, batch, batch % mini if mini < batch else batch)
    steps_per_epoch = train // batch
    epochs = int(config.trainer.total_epochs)
    configured = OmegaConf.select(config, "trainer.total_training_steps")
    verl_total = int(configured) if configured is not None else steps_per_epoch * epochs
    total = min(verl_total, steps_per_epoch * epochs)
    if total < 1:
        raise ConfigurationError(f"trainer.total_training_steps={configured}, trainer.total_epochs={epochs}: the run "
                                 "would train no step; set both to at least 1")
    if verl_total > total and log:
        logger.warning("trainer.total_training_steps=%s is not reached: trainer.total_epochs=%d epoch(s) of %d "
                       "step(s) end the run at step %d, without the last step's checkpoint and validation; raise "
                       "trainer.total_epochs to %d", configured, epochs, steps_per_epoch, total,
                       -(-verl_total // steps_per_epoch))
    if train % batch and log:
        logger.info("%d training task(s) past the last whole batch of data.train_batch_size=%d are left out of "
                    "each epoch (verl's drop_last; the data order is reshuffled each epoch)", train % batch, batch)
    return Sizing(train_tasks=train, val_tasks=val, batch=batch, mini_batch=mini, rollouts=n,
                  steps_per_epoch=steps_per_epoch, total_steps=total, validation=_validation(config, val, verl_total,
                                                                                           total))


def _validation(config: Any, val_tasks: int, verl_total: int, total: int) -> str:
    """When validation runs, in words; ``ConfigurationError`` when it runs without validation tasks."""
    before = bool(OmegaConf.select(config, "trainer.val_before_train", default=True))
    freq = int(OmegaConf.select(config, "trainer.test_freq", default=-1) or -1)
    when = ["before training"] if before else []
    if freq > 0:
        when.append(f"every {freq} steps")
        if verl_total <= total:  # verl validates at its last step, which the epochs may cut off
            when.append(f"at the end (step {total})")
    if not when:
        return "off"
    if val_tasks == 0:
        raise ConfigurationError(f"validation runs ({', '.join(when)}) and data.val_files holds no tasks: set "
                                 "data.val_files, or trainer.val_before_train=false and trainer.test_freq=-1")
    return ", ".join(when) + f", on {val_tasks} tasks"


@dataclass(frozen=True)
class RunStart:
    """Whether the run is new or resumes one, from ``trainer.resume_mode`` and the run's directory.

    Attributes:
        mode: ``trainer.resume_mode``.
        run_dir: ``trainer.default_local_dir``.
        resume_step: The step it resumes from; ``None`` for a new run.
        total_steps: The step it ends at (``Sizing.total_steps``).
        earlier: An earlier run's checkpoints and tracker in ``run_dir`` that a new run removes.
    """

    mode: str
    run_dir: Path
    resume_step: int | None
    total_steps: int
    earlier: tuple[Path, ...] = ()

    def describe(self) -> str:
        """The launch log's line."""
        if self.resume_step is not None:
            return f"resuming from step {self.resume_step} of {self.total_steps} ({self.run_dir})"
        if self.earlier:
            return (f"a new run in {self.run_dir} (trainer.resume_mode={self.mode}): the earlier run's "
                    f"{', '.join(path.name for path in self.earlier)} will be removed when it starts")
        return f"a new run in {self.run_dir} (trainer.resume_mode={self.mode})"


def checkpointed_step(run_dir: str | Path) -> int | None:
    """The step of the last checkpoint in ``run_dir``, as verl's ``find_latest_ckpt_path`` finds it; else ``None``."""
    tracker = Path(run_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    try:
        step = int(tracker.read_text().strip())
    except ValueError:
        return None
    return step if (Path(run_dir) / f"{CHECKPOINT_PREFIX}{step}").is_dir() else None


def resume_step(mode: str, run_dir: str | Path, resume_from_path: str | None = None) -> int | None:
    """The step a run with ``trainer.resume_mode=mode`` resumes from, as verl's ``_load_checkpoint`` reads it.

    ``disable``: none; ``auto``: the run directory's last checkpoint, if any; ``resume_path``: the
    ``global_step_N`` folder ``trainer.resume_from_path`` names. ``ConfigurationError`` for another mode,
    or a ``resume_from_path`` that is not an existing ``global_step_N`` folder.
    """
    if mode not in RESUME_MODES:
        raise ConfigurationError(f"trainer.resume_mode={mode}: verl takes {', '.join(RESUME_MODES)} (disable: a new "
                                 "run; auto: resume the run directory's last checkpoint; resume_path: resume "
                                 "trainer.resume_from_path)")
    if mode == "disable":
        return None
    if mode == "auto":
        return checkpointed_step(run_dir)
    folder = Path(str(resume_from_path or ""))
    if not folder.is_absolute():
        folder = Path.cwd() / folder  # verl reads it against the working directory
    step = folder.name.removeprefix(CHECKPOINT_PREFIX)
    if not resume_from_path or not folder.name.startswith(CHECKPOINT_PREFIX) or not step.isdigit() \
            or not folder.is_dir():
        raise ConfigurationError(f"trainer.resume_mode=resume_path with trainer.resume_from_path={resume_from_path}: "
                                 f"name an existing checkpoint folder, {CHECKPOINT_PREFIX}N of an earlier run")
    return int(step)


def plan_run(config: Any, sizing: Sizing) -> RunStart:
    """New run or resumed one; ``ConfigurationError`` for a resume with nothing left to train.

    verl's own default, ``trainer.resume_mode=auto``, resumes whatever run the directory holds, so a
    second ``train()`` of a finished run loaded its last checkpoint, trained no step and passed. The
    recipes set ``disable`` (a new run; ``AgentTrainer(resume=False)``), and a new run removes an earlier
    run's checkpoints and tracker before it starts (``clear_earlier_run``), so it can neither resume nor
    mix with them. A resume says the step it resumes from; one at or past the run's last step is refused.
    """
    mode = str(OmegaConf.select(config, "trainer.resume_mode", default="auto"))
    run_dir = Path(str(config.trainer.default_local_dir))
    step = resume_step(mode, run_dir, OmegaConf.select(config, "trainer.resume_from_path", default=None))
    if step is not None and step >= sizing.total_steps:
        raise ConfigurationError(
            f"trainer.resume_mode={mode}: the run in {run_dir} finished at step {step} of {sizing.total_steps}; "
            f"nothing is left to train. To train more, raise trainer.total_training_steps (or trainer.total_epochs) "
            f"above {step} and resume, or start a new run (trainer.resume_mode=disable, AgentTrainer(resume=False)), "
            "which removes this run's checkpoints")
    if step is not None:
        _check_resumable(mode, run_dir if mode == "auto" else None, config, step)
    earlier: tuple[Path, ...] = ()
    if mode == "disable" and run_dir.is_dir():
        found = sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir())
        earlier = tuple(found) + ((run_dir / TRACKER_FILE,) if (run_dir / TRACKER_FILE).is_file() else ())
    return RunStart(mode=mode, run_dir=run_dir, resume_step=step, total_steps=sizing.total_steps, earlier=earlier)


def _check_resumable(mode: str, run_dir: Path | None, config: Any, step: int) -> None:
    """Refuse resuming from a checkpoint without the actor's model shards: verl would train on the base weights."""
    folder = (run_dir / f"{CHECKPOINT_PREFIX}{step}" if run_dir is not None
              else Path(str(OmegaConf.select(config, "trainer.resume_from_path"))))
    if not folder.is_absolute():
        folder = Path.cwd() / folder
    if not any((folder / "actor").glob(f"{MODEL_SHARD_PREFIX}*.pt")):
        raise ConfigurationError(
            f"trainer.resume_mode={mode}: the checkpoint {folder} holds no model shards to resume from (it was saved "
            "with actor_rollout_ref.actor.checkpoint.save_contents without 'model', as a smoke run saves only its "
            "Hugging Face model), so verl would go on from the base model's weights; start a new run "
            "(trainer.resume_mode=disable, AgentTrainer(resume=False)), or save [model, optimizer, extra] to resume")


def clear_earlier_run(start: RunStart) -> None:
    """Remove an earlier run's checkpoints and tracker from a new run's directory, saying which (one log line)."""
    if start.resume_step is not None or not start.earlier:
        return
    import shutil

    for path in start.earlier:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    logger.info("a new run in %s: removed the earlier run's %s (trainer.resume_mode=%s; resume it with "
                "trainer.resume_mode=auto, AgentTrainer(resume=True))", start.run_dir,
                ", ".join(path.name for path in start.earlier), start.mode)
