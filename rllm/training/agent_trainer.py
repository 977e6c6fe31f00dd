"""``AgentTrainer``: train a Strands agent on your own tasks and reward, with the arguments that evaluate it.

rLLM's entry point, with its signature: ``AgentTrainer(workflow_class=StrandsWorkflow,
workflow_args=..., config=..., train_dataset=..., val_dataset=...).train()``. ``workflow_args`` are
exactly what ``AgentWorkflowEngine(StrandsWorkflow, workflow_args, ...)`` takes to evaluate the agent
(``agent_factory`` or ``tools`` with ``system_prompt``, ``reward_fn``, ``budget``, ``task_to_prompt``);
the datasets are lists of task dicts with fields of your own (or a JSON, JSONL or parquet file of
them, or a ``datasets.Dataset``), and each task reaches the factory and the reward unchanged.

``train()`` writes the run's directory: the tasks as verl rows (``data/``), the Python objects the
verl workers need (``workflow.pkl``, cloudpickled, so a factory or reward defined in your script
works; an importable one is named by its dotted path instead), and a recipe over
``strands_base.yaml`` (``agent_trainer.yaml``). It then runs verl's own trainer on it in a child
process (``python -m rllm.training.verl.train --config-dir RUN --config-name agent_trainer``, which
checks everything before Ray starts) and returns verl's per-step metrics, the validation scores, the final
policy as a Hugging Face model (``model_path``) and the learning curve.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rllm.data.tasks import Tasks, load_tasks
from rllm.data.verl_rows import task_rows, write_parquet
from rllm.errors import ConfigurationError, TrainingRunError
from rllm.integrations.strands import Budget
from rllm.integrations.strands.runner import check_agent_choice
from rllm.training.curves import LEARNING_CURVE, read_metrics, validation_metrics, validation_score
from rllm.training.verl._dotted import PICKLE_SUFFIX, import_object
from rllm.training.verl.export import final_model_dir
from rllm.training.verl.lora_export import adapter_dir
from rllm.workflows import StrandsWorkflow

logger = logging.getLogger(__name__)

RECIPE_NAME = "agent_trainer"
"""The recipe ``train()`` writes into the run's directory."""
OBJECTS_FILE = "workflow" + PICKLE_SUFFIX
"""The cloudpickled objects the verl workers load (``rllm.training.verl._dotted``)."""
_TRAINABLE_ARGS = ("agent_factory", "tools", "system_prompt", "reward_fn", "budget", "task_to_prompt", "model_kwargs")
_REFUSED_ARGS = {
    "trace_store": "in training the agent's own client calls the trainer's policy server: set config "
                   "rllm.agent_loop.own_client=true and build its client from rllm.tracing.policy_endpoint()",
    "agent_kwargs": "build the agent yourself with agent_factory to give it further arguments",
}


@dataclass
class TrainResult:
    """What a training run left.

    Attributes:
        metrics: verl's logged metrics, one dict per logged step (``step`` plus verl's names, e.g.
            ``critic/score/mean``, ``actor/grad_norm``, ``rllm/guard/groups_with_signal_share``).
        metrics_path: The JSON-lines file verl's file logger wrote them to.
        run_dir: The run's directory (rows, recipe, objects, checkpoints, log).
        log_path: The trainer's console output.
        resumed_from_step: The step a resumed run continued from (``AgentTrainer(resume=True)``); ``None``
            for a new run. ``metrics`` then holds the earlier steps too.
        model_path: The final policy as a Hugging Face model (safetensors, tokenizer, chat template:
            ``global_step_N/actor/huggingface`` of the last checkpoint), which transformers loads and
            ``vllm serve`` serves; ``None`` when the run saved none (``trainer.save_freq``,
            ``actor_rollout_ref.actor.checkpoint.save_contents``).
        validation: Step -> verl's validation metrics at that step (``val-core/...``, ``val-aux/...``; step 0
            is before the first update); empty without a ``val_dataset``.
        curve_path: ``learning_curve.png`` (training reward, validation score, tool calls per episode by step).
        adapter_path: A LoRA run's adapter in PEFT's format (``adapter_config.json``,
            ``adapter_model.safetensors``; ``global_step_N/actor/lora_adapter``), beside ``model_path``, which then
            holds the merged model; ``None`` for a full fine-tune.
    """

    metrics: list[dict[str, Any]]
    metrics_path: Path
    run_dir: Path
    log_path: Path
    model_path: Path | None = None
    validation: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    curve_path: Path | None = None
    resumed_from_step: int | None = None
    adapter_path: Path | None = None


class AgentTrainer:
    """Trains the agent of a ``StrandsWorkflow`` with verl's own trainer (RLOO) on your tasks and reward.

    Args:
        workflow_class: ``StrandsWorkflow`` (the workflow the verl agent loop runs).
        workflow_args: As ``AgentWorkflowEngine`` takes them: ``agent_factory(model, task)`` or ``tools``
            (a list, or a function returning one) with ``system_prompt``; ``reward_fn(task, final_answer)``
            returning a ``RewardOutput`` or a number; ``budget`` (a ``Budget``); ``task_to_prompt(task)``
            (default: the task's ``question``/``prompt``/``problem``); ``model_kwargs={"params": {"max_tokens": N}}``
            (the most tokens one model call samples).
        config: verl/Hydra overrides over the recipe: a list (``["data.train_batch_size=8"]``) or a dict of
            dotted keys (``{"data.train_batch_size": 8}``); ``actor_rollout_ref.model.path`` names the policy.
        train_dataset: The training tasks: a list of dicts, a ``.json``/``.jsonl``/``.parquet`` path, or a
            ``datasets.Dataset``.
        val_dataset: The validation tasks, in any of those forms, scored before the first step, every
            ``trainer.test_freq`` steps and at the last; ``None`` turns validation off.
        backend: ``"verl"`` (the only one).
        cpu: Run verl on the CPU (the launcher's ``--cpu``).
        smoke: Two real steps of two prompts x two rollouts (the launcher's ``--smoke``), the last step's policy
            exported; with a ``val_dataset``, validated before the first step and after the last.
        output_dir: The run's directory (verl's ``trainer.default_local_dir``); default ``runs/<experiment>``.
        recipe_base: The recipe body the run's recipe extends (shipped in ``rllm/training/verl/config``).
        resume: ``False``: a new run (an earlier run's checkpoints in ``output_dir`` are removed when it
            starts); ``True``: continue the run in ``output_dir`` from its last checkpoint (verl's
            ``trainer.resume_mode=auto``; a new run when there is none, an error when it is finished).
    """

    def __init__(
        self,
        workflow_class: type | None = None,
        workflow_args: Mapping[str, Any] | None = None,
        config: Sequence[str] | Mapping[str, Any] | None = None,
        train_dataset: Tasks | None = None,
        val_dataset: Tasks | None = None,
        backend: str = "verl",
        *,
        cpu: bool = False,
        smoke: bool = False,
        output_dir: str | Path | None = None,
        recipe_base: str = "strands_base",
        resume: bool = False,
    ) -> None:
        if backend != "verl":
            raise ConfigurationError(f"AgentTrainer: backend={backend!r}; rllm trains with verl (backend='verl')")
        if workflow_class is not StrandsWorkflow:
            name = getattr(workflow_class, "__name__", repr(workflow_class))
            raise ConfigurationError(f"AgentTrainer: workflow_class={name}; verl's agent loop runs a StrandsWorkflow's "
                                     "agent, reward and budget (a subclass's own methods would not run in training): "
                                     "pass workflow_class=StrandsWorkflow")
        self.workflow_args = _check_workflow_args(dict(workflow_args or {}))
        self.overrides, self.config = _split_config(config)
        if train_dataset is None:
            raise ConfigurationError("AgentTrainer: train_dataset is required (a list of task dicts or a task file)")
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.cpu, self.smoke, self.recipe_base, self.resume = cpu, smoke, recipe_base, resume
        experiment = self.config.get("trainer.experiment_name") or "strands-agent"
        self.run_dir = Path(output_dir if output_dir is not None else Path("runs") / str(experiment)).resolve()

    # ------------------------------------------------------------------ the run's files
    def write_run(self) -> Path:
        """Write the rows, the objects and the recipe into the run's directory; the recipe's path."""
        args = self.workflow_args
        to_prompt = args.get("task_to_prompt")
        data = self.run_dir / "data"
        train = write_parquet(task_rows(load_tasks(self.train_dataset, name="train_dataset"), "train",
                                        task_to_prompt=to_prompt), data / "train.parquet")
        validation = train
        if self.val_dataset is not None:
            validation = write_parquet(task_rows(load_tasks(self.val_dataset, name="val_dataset"), "validation",
                                                 task_to_prompt=to_prompt), data / "validation.parquet")
        objects: dict[str, Any] = {}
        loop: dict[str, Any] = {"agent_factory": None, "tool_factory": None}
        if "agent_factory" in args:
            loop["agent_factory"] = self._reference(args["agent_factory"], "agent_factory", objects)
        else:
            tools = args["tools"]
            factory = tools if callable(tools) else _ToolList(list(tools))
            loop["tool_factory"] = self._reference(factory, "tools", objects)
            loop["system_prompt"] = args.get("system_prompt")
        if args.get("budget") is not None:
            loop["budget"] = dataclasses.asdict(args["budget"])
        max_tokens = ((args.get("model_kwargs") or {}).get("params") or {}).get("max_tokens")
        if max_tokens is not None:
            loop["max_tokens_per_turn"] = int(max_tokens)
        if to_prompt is not None:  # the rows hold its prompts already; the recipe says how they were made
            loop["task_to_prompt"] = self._reference(to_prompt, "task_to_prompt", objects)
        trainer: dict[str, Any] = {"default_local_dir": str(self.run_dir), "logger": ["console", "file"],
                                   "resume_mode": "auto" if self.resume else "disable"}
        if self.val_dataset is None:
            trainer.update(val_before_train=False, test_freq=-1)
        recipe: dict[str, Any] = {
            "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
            "defaults": ["ppo_trainer", self.recipe_base, "_self_"],
            "data": {"train_files": str(train), "val_files": str(validation)},
            "trainer": trainer,
            "rllm": {"reward_fn": self._reference(args["reward_fn"], "reward_fn", objects), "agent_loop": loop},
        }
        if objects:
            import cloudpickle

            (self.run_dir / OBJECTS_FILE).write_bytes(cloudpickle.dumps(objects))
        path = self.run_dir / f"{RECIPE_NAME}.yaml"
        path.write_text("# Written by rllm's AgentTrainer: the run's recipe (python -m rllm.training.verl.train "
                        f"--config-dir {self.run_dir} --config-name {RECIPE_NAME})\n"
                        + yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        return path

    def _reference(self, obj: Any, key: str, objects: dict[str, Any]) -> str:
        """``module:name`` when ``obj`` is importable by it in any process, else an entry of the pickled objects."""
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if module and name and module != "__main__" and "<" not in name:
            path = f"{module}:{name}"
            try:
                if import_object(path) is obj:
                    return path
            except (ImportError, ConfigurationError):
                pass
        objects[key] = obj
        return f"{self.run_dir / OBJECTS_FILE}:{key}"

    def command(self, *, dry_run: bool = False) -> list[str]:
        """The launcher's command line for the run's recipe."""
        flags = [flag for flag, on in (("--dry-run", dry_run), ("--cpu", self.cpu), ("--smoke", self.smoke)) if on]
        return [sys.executable, "-m", "rllm.training.verl.train", *flags, "--config-dir", str(self.run_dir),
                "--config-name", RECIPE_NAME, *self._smoke_validation(), *self.overrides]

    def _smoke_validation(self) -> list[str]:
        """With ``smoke`` and a ``val_dataset``: validate before the first step and at the last (the overlay does not).

        On the command line, since the smoke overlay is merged after the run's recipe; before the user's overrides.
        """
        if not (self.smoke and self.val_dataset is not None):
            return []
        return ["trainer.val_before_train=true", "trainer.test_freq=${trainer.total_training_steps}"]

    def _env(self) -> dict[str, str]:
        """This process's environment, with every folder it imports from on ``PYTHONPATH``.

        So the user's modules (by path, or named inside a pickled object) import in the launcher and
        its Ray workers as they do here: the working directory, the script's folder, ``sys.path``'s own.
        """
        prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
        paths = [os.getcwd()]
        for entry in sys.path:
            folder = Path(entry or os.getcwd()).resolve()
            if folder.is_dir() and not any(str(folder).startswith(prefix) for prefix in prefixes):
                paths.append(str(folder))
        existing = os.environ.get("PYTHONPATH")
        return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([*paths, *([existing] if existing else [])])),
                "VERL_FILE_LOGGER_PATH": str(self.run_dir / "metrics.jsonl"),
                "OTEL_SDK_DISABLED": os.environ.get("OTEL_SDK_DISABLED", "true")}

    # ------------------------------------------------------------------ running
    def dry_run(self) -> str:
        """Write the run and check all the launcher checks (the factory, the reward on the first task); the config."""
        self.write_run()
        proc = subprocess.run(self.command(dry_run=True), env=self._env(), capture_output=True, text=True)
        if proc.returncode:
            raise TrainingRunError(_failure(proc.stderr + proc.stdout, proc.returncode))
        return proc.stdout

    def train(self) -> TrainResult:
        """Run verl's trainer on the tasks; its per-step metrics. ``TrainingRunError`` with the cause when it fails."""
        from rllm.training.verl.preflight import resume_step

        self.write_run()
        metrics_path, log_path = self.run_dir / "metrics.jsonl", self.run_dir / "train.log"
        mode = str(self.config.get("trainer.resume_mode") or ("auto" if self.resume else "disable"))
        resumed = resume_step(mode, self.run_dir, self.config.get("trainer.resume_from_path"))
        if resumed is None:  # a resumed run's launcher keeps the earlier steps' metrics
            metrics_path.unlink(missing_ok=True)
        command = self.command()
        started = time.time()
        logger.info("training: %s (console: %s)", " ".join(command), log_path)
        lines: list[str] = []
        with log_path.open("w", encoding="utf-8") as log, subprocess.Popen(
                command, env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                sys.stdout.write(line)
                lines = [*lines[-400:], line]
            returncode = process.wait()
        if returncode:
            raise TrainingRunError(_failure("".join(lines), returncode) + f" (the whole log: {log_path})")
        metrics = read_metrics(metrics_path)
        validation = validation_metrics(metrics)
        for step, values in validation.items():
            score = validation_score(values)
            logger.info("validation at step %d: score %s", step, "n/a" if score is None else f"{score:.3f}")
        model_path = final_model_dir(self.run_dir, since=started)
        adapter_path = adapter_dir(model_path) if model_path is not None else None
        logger.info("final policy (Hugging Face model): %s%s", model_path,
                    f"; its LoRA adapter (PEFT): {adapter_path}" if adapter_path else "")
        curve = self.run_dir / LEARNING_CURVE
        return TrainResult(metrics=metrics, metrics_path=metrics_path, run_dir=self.run_dir, log_path=log_path,
                           model_path=model_path, validation=validation,
                           curve_path=curve if curve.is_file() and curve.stat().st_mtime >= started else None,
                           resumed_from_step=resumed, adapter_path=adapter_path)


@dataclass
class _ToolList:
    """A tool list as the tool factory the verl loop calls (``tool_factory(**tool_kwargs)``)."""

    tools: list[Any]

    def __call__(self) -> list[Any]:
        return list(self.tools)


def _check_workflow_args(args: dict[str, Any]) -> dict[str, Any]:
    for key, instead in _REFUSED_ARGS.items():
        if key in args:
            raise ConfigurationError(f"AgentTrainer: workflow_args[{key!r}] does not apply in training: {instead}")
    unknown = sorted(set(args) - set(_TRAINABLE_ARGS))
    if unknown:
        raise ConfigurationError(f"AgentTrainer: unknown workflow_args {unknown}; StrandsWorkflow trains with "
                                 f"{', '.join(_TRAINABLE_ARGS)}")
    check_agent_choice("AgentTrainer: workflow_args", agent_factory=args.get("agent_factory"), tools=args.get("tools"),
                       system_prompt=args.get("system_prompt"))
    if args.get("reward_fn") is None:
        raise ConfigurationError("AgentTrainer: workflow_args['reward_fn'] is required: training optimises it")
    for key in ("agent_factory", "reward_fn", "task_to_prompt"):
        if key in args and not callable(args[key]):
            raise ConfigurationError(f"AgentTrainer: workflow_args[{key!r}] is a {type(args[key]).__name__}, "
                                     "not a function")
    if args.get("budget") is not None and not isinstance(args["budget"], Budget):
        raise ConfigurationError(f"AgentTrainer: workflow_args['budget'] is a {type(args['budget']).__name__}, "
                                 "not a rllm.integrations.strands.Budget")
    params = (args.get("model_kwargs") or {}).get("params") or {}
    extra = sorted(set(args.get("model_kwargs") or {}) - {"params"}) + sorted(set(params) - {"max_tokens"})
    if extra:
        raise ConfigurationError(f"AgentTrainer: model_kwargs {extra} do not apply in training: the trainer samples "
                                 "(actor_rollout_ref.rollout.temperature, top_p); only params.max_tokens is kept")
    return args


def _split_config(config: Sequence[str] | Mapping[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
    """The Hydra overrides of ``config`` (a list as given; a dict of dotted keys written as overrides), and its keys.

    They go on the launcher's command line after ``--cpu``'s and ``--smoke``'s, so the user's values win.
    """
    if config is None:
        return [], {}
    if isinstance(config, str):
        raise ConfigurationError("AgentTrainer: config is a list of Hydra overrides or a dict of dotted keys, "
                                 f"not the string {config!r}")
    if isinstance(config, Mapping):
        named = {str(key): value for key, value in config.items()}
        return [f"{key}={_hydra_value(value)}" for key, value in named.items()], named
    overrides = [str(item) for item in config]
    return overrides, {item.split("=", 1)[0].lstrip("+~"): item.split("=", 1)[1] for item in overrides if "=" in item}


def _hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted, so any text survives the command line)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(item) for item in value) + "]"
    # Hydra unescapes backslashes only before a quote (or the closing one): double those, then escape the quotes.
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, str(value))
    return "'" + text.replace("'", "\\'") + "'"


def _failure(output: str, returncode: int) -> str:
    """The cause a failed run printed: its last error line (a ``...Error: message``), else its last lines."""
    errors = [line.strip() for line in output.splitlines() if "Error: " in line and not line.startswith(" ")]
    cause = errors[-1] if errors else " | ".join(output.strip().splitlines()[-5:])
    return f"verl's trainer exited with status {returncode}: {cause}"

