"""verl's own task runner and trainer, with rllm's training guards on every step.

verl 0.9.1's ``run_ppo(config, task_runner_class)`` takes the task runner "for recipe to change".
``GuardedTaskRunner`` is verl's ``TaskRunnerV1`` whose trainer is verl's own trainer for the
recipe's ``trainer.v1.trainer_mode`` (``sync``) with one addition: after verl computes a step's
metrics, the guards of ``rllm.training.verl.guards`` read the batch verl trained on (from verl's
TransferQueue), add their metrics and stop the run when one is violated. The trainer class is put
into verl's public ``TRAINER_REGISTRY`` in the runner's own process only.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1

from rllm.errors import TrainingGuardError
from rllm.training.verl.guards import (
    GUARDS_KEY,
    GuardSettings,
    StepRollouts,
    TrainingGuards,
    step_metrics,
    summary_line,
)
from rllm.training.verl.plugin import BACKEND_NAME

logger = logging.getLogger(__name__)

_STEP_FIELDS = ("uid", "rm_scores", "response_mask")
_LOGPROB_FIELDS = ("rollout_log_probs", "old_log_probs")


def _rows(value: Any) -> list[Any]:
    """The rows of a TransferQueue field: tensors (nested or padded) unbound, other columns as a list."""
    if hasattr(value, "unbind"):
        return list(value.unbind(0))
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def read_step(batch: Any) -> StepRollouts:
    """What the guards need of a step's batch, read from verl's TransferQueue (padding rows left out)."""
    import transfer_queue as tq

    keep = [not tag.get("is_padding", False) for tag in batch.tags]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(_STEP_FIELDS))
    masks = [m.bool() for m in _rows(data["response_mask"])]
    rewards = [float(r.sum()) for r in _rows(data["rm_scores"])]
    groups = _rows(data["uid"])
    rollout_lp: list[list[float]] = []
    actor_lp: list[list[float]] = []
    try:
        logprobs = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=list(_LOGPROB_FIELDS))
    except Exception:  # noqa: BLE001 - no rollout log-probs (calculate_log_probs off): no gap to measure
        logprobs = None
    if logprobs is not None:
        for mask, sampled, actor in zip(masks, _rows(logprobs["rollout_log_probs"]), _rows(logprobs["old_log_probs"]),
                                        strict=True):
            length = min(len(mask), len(sampled), len(actor))
            picked = mask[:length]
            rollout_lp.append(sampled[:length][picked].tolist())
            actor_lp.append(actor[:length][picked].tolist())
    truncated: list[bool] = []
    tool_calls: list[float | None] = []
    try:
        extras = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                       select_fields=["extra_fields"])["extra_fields"])
    except Exception:  # noqa: BLE001 - an agent loop that reports no extra fields
        extras = []
    for extra in extras:
        extra = extra if isinstance(extra, dict) else {}
        truncated.append(bool(extra.get("response_truncated", False)))
        calls = extra.get("num_tool_calls")
        tool_calls.append(None if calls is None else float(calls))

    def kept(values: list[Any]) -> list[Any]:
        return [v for v, k in zip(values, keep, strict=False) if k] if len(values) == len(keep) else values

    return StepRollouts(groups=kept(groups), rewards=kept(rewards), rollout_logprobs=kept(rollout_lp),
                        actor_logprobs=kept(actor_lp), truncated=kept(truncated), tool_calls=kept(tool_calls))


def weight_sync_metrics() -> dict[str, float]:
    """The embedded servers' last syncs: whether every one serves the actor's weights, and their oldest version."""
    from rllm.training.verl.embedded_rollout import checksum_matches, server_name

    reports: list[dict[str, Any]] = []
    while True:
        try:
            server = ray.get_actor(server_name(len(reports)))
        except ValueError:
            break
        reports.append(ray.get(server.sync_report.remote()))
    if not reports:
        return {}
    versions = [r.get("global_steps") for r in reports]
    return {"rllm/weights/checksum_match": min(checksum_matches(r) for r in reports),
            "rllm/weights/version": float(min(v for v in versions if v is not None)) if None not in versions else -1.0,
            "rllm/weights/replicas": float(len(reports))}


def guarded_trainer_class(base: type) -> type:
    """``base`` (a verl v1 trainer) whose every step adds the guard metrics and stops on a violated guard."""

    class GuardedTrainer(base):  # type: ignore[misc, valid-type]
        """verl's trainer plus rllm's training guards (``rllm.training.verl.guards``).

        The rollout guards run once the actor's log-probs and the rewards are in, before the
        update (``_compute_advantage``); the loss guard right after the update, before the step's
        checkpoint and weight sync (``_update_actor``). A stop logs the step's metrics first, so
        the tracker shows what stopped it.
        """

        @property
        def _guards(self) -> TrainingGuards:
            if not hasattr(self, "_rllm_guards"):
                block = OmegaConf.select(self.config, GUARDS_KEY, default=None)
                values = OmegaConf.to_container(block, resolve=True) if block is not None else {}
                self._rllm_guards = TrainingGuards(GuardSettings.from_mapping(values))  # type: ignore[arg-type]
            return self._rllm_guards

        def _stop(self, error: TrainingGuardError, metrics: dict) -> None:
            tracker = getattr(self, "logger", None)
            if tracker is not None:
                tracker.log(data=dict(metrics), step=self.global_steps)
            raise error

        def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
            metrics.update(step_metrics(read_step(batch)))
            try:
                self._guards.check_rollouts(self.global_steps, metrics)
            except TrainingGuardError as error:
                self._stop(error, metrics)
            return super()._compute_advantage(batch, metrics)

        def _update_actor(self, batch: Any, metrics: dict) -> Any:
            result = super()._update_actor(batch, metrics)
            try:
                self._guards.check_update(self.global_steps, metrics)
            except TrainingGuardError as error:
                self._stop(error, metrics)
            return result

        def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> Any:
            result = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            if OmegaConf.select(self.config, "actor_rollout_ref.rollout.name") == BACKEND_NAME:
                metrics.update(weight_sync_metrics())
            line = summary_line(global_steps, metrics)
            logger.info(line)
            print(line, flush=True)  # noqa: T201 - the console a user watches
            return result

    GuardedTrainer.__name__ = GuardedTrainer.__qualname__ = f"Guarded{base.__name__}"
    return GuardedTrainer


class _GuardedTaskRunner(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined, misc]
    """verl's ``TaskRunnerV1`` whose trainer is the guarded one."""

    def run(self, config: Any) -> Any:
        """Put the guarded trainer in verl's trainer registry (this process only), then run as verl does."""
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, get_trainer_cls

        mode = config.trainer.v1.trainer_mode
        base = get_trainer_cls(mode)
        if not base.__name__.startswith("Guarded"):
            TRAINER_REGISTRY[mode] = guarded_trainer_class(base)
        return super().run(config)


GuardedTaskRunner = ray.remote(num_cpus=1)(_GuardedTaskRunner)
"""The task runner ``rllm.training.verl.train`` hands to verl's ``run_ppo``."""
