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
import time
from dataclasses import dataclass
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
ROLLOUT_SECONDS = "timing_s/rllm_rollouts"
"""Seconds a step spent generating its rollouts (verl's ``timing_s/gen`` times only the replay buffer's sampling)."""
BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
"""verl's switch that trains against the rollout's own log-probs instead of recomputing them with the actor."""


def _rows(value: Any) -> list[Any]:
    """The rows of a TransferQueue field: tensors (nested or padded) unbound, other columns as a list."""
    if hasattr(value, "unbind"):
        return list(value.unbind(0))
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def _kept(batch: Any) -> list[str]:
    """The keys of the batch's real rollouts (verl pads a batch with rows tagged ``is_padding``)."""
    return [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]


@dataclass
class LogProbPairs:
    """Per rollout, the log-probs its sampled tokens were sampled with and the actor's for the same tokens."""

    rollout: list[list[float]]
    actor: list[list[float]]


def _pairs(sampled: Any, actor: Any, masks: Any) -> LogProbPairs:
    pairs = LogProbPairs([], [])
    for mask, rollout_lp, actor_lp in zip(_rows(masks), _rows(sampled), _rows(actor), strict=True):
        picked = mask.bool()
        length = min(len(picked), len(rollout_lp), len(actor_lp))
        pairs.rollout.append(rollout_lp[:length][picked[:length]].tolist())
        pairs.actor.append(actor_lp[:length][picked[:length]].tolist())
    return pairs


def read_logprob_pairs(batch: Any) -> LogProbPairs:
    """Every real rollout's sampled and actor log-probs, after verl recomputed them (``old_log_probs``)."""
    import transfer_queue as tq

    keys = _kept(batch)
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                           select_fields=["rollout_log_probs", "old_log_probs", "response_mask"])
    return _pairs(data["rollout_log_probs"], data["old_log_probs"], data["response_mask"])


def audit_logprob_pairs(worker_group: Any, batch: Any, rollouts: int, temperature: float) -> LogProbPairs:
    """The actor's log-probs recomputed for ``rollouts`` of the batch (rounded to the data-parallel size).

    verl's bypass mode trains against the rollout's own log-probs, so nothing compares them with the
    actor's; this asks the actor (verl's ``compute_log_prob``) for the first rollouts' log-probs, as
    verl's decoupled mode does for all of them, before the update.
    """
    import transfer_queue as tq
    from verl.workers.utils.padding import response_from_nested

    keys = _kept(batch)
    size = max(int(getattr(worker_group, "world_size", 1) or 1), 1)
    count = min(len(keys), -(-max(rollouts, 1) // size) * size)
    count -= count % size
    if count == 0:
        return LogProbPairs([], [])
    sample = batch.select_keys(keys[:count])
    sample.extra_info.update({"calculate_entropy": False, "compute_loss": False, "temperature": temperature})
    worker_group.compute_log_prob(sample)
    data = tq.kv_batch_get(keys=sample.keys, partition_id=sample.partition_id,
                           select_fields=["log_probs", "rollout_log_probs", "response_mask"])
    actor = response_from_nested(data["log_probs"], data["response_mask"])
    return _pairs(data["rollout_log_probs"], actor, data["response_mask"])


def read_step(batch: Any, logprobs: LogProbPairs | None = None) -> StepRollouts:
    """What the guards need of a step's batch, read from verl's TransferQueue (padding rows left out)."""
    import transfer_queue as tq

    keys = _kept(batch)
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(_STEP_FIELDS))
    rewards = [float(r.sum()) for r in _rows(data["rm_scores"])]
    groups = _rows(data["uid"])
    truncated: list[bool] = []
    tool_calls: list[float | None] = []
    extras = _rows(tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                   select_fields=["extra_fields"])["extra_fields"])
    for extra in extras:
        extra = extra if isinstance(extra, dict) else {}
        truncated.append(bool(extra.get("response_truncated", False)))
        calls = extra.get("num_tool_calls")
        tool_calls.append(None if calls is None else float(calls))
    return StepRollouts(groups=groups, rewards=rewards,
                        rollout_logprobs=logprobs.rollout if logprobs else [],
                        actor_logprobs=logprobs.actor if logprobs else [], truncated=truncated, tool_calls=tool_calls)


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

        def prepare_step(self) -> dict:
            started = time.perf_counter()
            metrics = dict(super().prepare_step() or {})
            metrics[ROLLOUT_SECONDS] = time.perf_counter() - started  # verl's "gen" times only the sampling
            return metrics

        def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
            batch = super()._compute_old_log_prob(batch, metrics)
            self._logprobs: LogProbPairs | None = None
            if self._guards.settings.max_logprob_gap is None:
                return batch
            if not OmegaConf.select(self.config, "actor_rollout_ref.rollout.calculate_log_probs", default=True):
                self._stop(TrainingGuardError(
                    f"step {self.global_steps}: the rollout returns no log-probs "
                    "(actor_rollout_ref.rollout.calculate_log_probs=false), so the served weights cannot be compared "
                    "with the trained ones: set it to true, or turn the guard off (rllm.guards.max_logprob_gap=null)",
                    step=self.global_steps), metrics)
            if OmegaConf.select(self.config, BYPASS_KEY, default=False):
                self._logprobs = audit_logprob_pairs(
                    self.actor_rollout_wg, batch, self._guards.settings.logprob_audit_rollouts,
                    float(self.config.actor_rollout_ref.rollout.temperature))
            else:
                self._logprobs = read_logprob_pairs(batch)
            return batch

        def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
            metrics.update(step_metrics(read_step(batch, getattr(self, "_logprobs", None))))
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
