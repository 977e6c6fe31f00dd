"""verl's own task runner and synchronous trainer, with rllm's training guards on every step.

``GuardedTrainer`` is verl's ``PPOTrainerSync`` registered with verl's public ``register_trainer``
as ``trainer.v1.trainer_mode=rllm_sync`` (the recipes' mode; verl's own ``sync`` stays verl's). It
adds, per step: the group audit as soon as the rewards are in (before the actor sees the batch), the
rollout guards of ``rllm.training.verl.trainer.guards`` once verl has the audited log-probs (before the
update), RLOO counted per rollout when a rollout came back as several samples
(``rllm.training.verl.trainer.advantage``), the loss guard right after the update (before the checkpoint
and the weight sync), and after every weight sync the served weights compared with the actor's by fingerprint
(``rllm.training.verl.weights.served_weights``: the embedded backend, vLLM, SGLang). A stop logs the step's metrics
first, so the tracker shows what stopped it, and ends the run with ``TrainingGuardError`` naming the
step. A run that ends without one step whose rewards varied in a group fails "no learning signal"
(``TrainingGuards.check_run_end``). ``GuardedTaskRunner`` is verl's ``TaskRunnerV1``, which
``rllm.training.verl.train`` hands to verl's ``run_ppo``; it imports this module in the task runner's
process, where verl looks the trainer up. The private verl methods and attributes used here are listed
and pinned in ``verl_internals``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from rllm.errors import ConfigurationError, TrainingGuardError
from rllm.training.verl.settings import read_settings
from rllm.training.verl.trainer.advantage import check_split_rollouts, split_rollouts
from rllm.training.verl.trainer.guards import (
    GUARDED_MODE,
    PREFIX,
    StepRollouts,
    TrainingGuards,
    step_metrics,
    summary_line,
    zero_advantage_share,
)
from rllm.training.verl.trainer.rollout_records import write_step_records
from rllm.training.verl.trainer.step_batch import (
    LogProbPairs,
    audit_logprob_pairs,
    read_advantages,
    read_logprob_pairs,
    read_step,
    write_rollout_advantages,
)
from rllm.training.verl.verl_internals import as_sync_mode, ray_actor_class, trainer_tracker
from rllm.training.verl.weights.served_weights import (
    ServedWeightsCheck,
    actor_fingerprint,
    actor_trainable,
    served_weights,
)

logger = logging.getLogger(__name__)

ROLLOUT_SECONDS = "timing_s/rllm_rollouts"
"""Seconds a step spent generating its rollouts (verl's ``timing_s/gen`` times only the replay buffer's sampling)."""
BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
"""verl's switch that trains against the rollout's own log-probs instead of recomputing them with the actor."""


@register_trainer(GUARDED_MODE)
class GuardedTrainer(PPOTrainerSync):
    """verl's synchronous trainer plus rllm's training guards (see the module docstring)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        with as_sync_mode(config):  # verl's trainer branches on its mode being "sync" while it initialises
            super().__init__(config, *args, **kwargs)
        settings = read_settings(self.config)
        self._guards = TrainingGuards(settings.guards)
        self._records = settings.rollout_records
        self._served = ServedWeightsCheck()
        self._weight_metrics: dict[str, float] = {}
        self._trainable: dict[str, float] = {}
        self._logprobs: LogProbPairs | None = None
        self._rollouts = StepRollouts(groups=[], rewards=[])

    def _stop(self, error: TrainingGuardError, metrics: dict) -> None:
        tracker = trainer_tracker(self)
        if tracker is not None:
            tracker.log(data=dict(metrics), step=self.global_steps)
        raise error

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """The training loop of verl, then the end-of-run check: a run in which no step had a learning signal fails."""
        result = super().fit(*args, **kwargs)
        self._guards.check_run_end(self.global_steps - 1)
        return result

    # ------------------------------------------------------------------ weights
    def _check_served_weights(self) -> None:
        """After a sync: the rollout servers serve the actor's weights (``weights.served_weights``)."""
        if not self._guards.settings.served_weights:
            return
        rollout = self.config.actor_rollout_ref.rollout
        self._weight_metrics = self._served.check(
            self.global_steps, actor_fingerprint(self.actor_rollout_wg, str(rollout.dtype)),
            served_weights(str(rollout.name), self))

    def on_init_end(self) -> None:
        super().on_init_end()
        self._report_trainable()
        self._check_served_weights()

    def _report_trainable(self) -> None:
        """Log what the actor trains; a LoRA actor that trains more than its adapter stops the run before step 1."""
        count = actor_trainable(self.actor_rollout_wg)
        line = (f"the actor trains {count.trainable} of its {count.total} parameters "
                f"({100.0 * count.trainable / max(count.total, 1):.4f}%)"
                + (", all of them LoRA adapter weights (peft's count)" if count.adapter and not count.outside_adapter
                   else ""))
        logger.info(line)
        print(line, flush=True)  # noqa: T201 - the console a user watches
        if count.outside_adapter:
            raise TrainingGuardError(f"the LoRA actor also trains {len(count.outside_adapter)} parameters outside its "
                                     f"adapter ({', '.join(count.outside_adapter[:3])}): a LoRA run trains the adapter "
                                     "only", step=self.global_steps)
        self._trainable = count.metrics()

    def on_step_end(self) -> None:
        super().on_step_end()
        self._trainable = actor_trainable(self.actor_rollout_wg).metrics()  # the next step's metrics: peak memory
        try:
            self._check_served_weights()
        except TrainingGuardError as error:
            self._stop(error, {})

    # ------------------------------------------------------------------ a step
    def prepare_step(self) -> dict:
        started = time.perf_counter()
        metrics = dict(super().prepare_step() or {})
        metrics[ROLLOUT_SECONDS] = time.perf_counter() - started  # verl's "gen" times only the sampling
        return metrics

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        # The groups first: a dropped rollout leaves a batch the actor cannot split into its micro-batches. Their
        # stop names the step's other rollout stops too (all but the log-prob gap, which needs the actor's pass).
        self._rollouts = read_step(batch, int(self.config.actor_rollout_ref.rollout.n))
        try:
            self._guards.check_groups(self.global_steps, self._rollouts)
        except TrainingGuardError as error:
            read = metrics | step_metrics(self._rollouts)
            self._stop(self._guards.with_other_stops(error, read), read)
        batch = super()._compute_old_log_prob(batch, metrics)
        self._logprobs = None
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
                float(self.config.actor_rollout_ref.rollout.temperature),
                int(OmegaConf.select(self.config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                                     default=None) or 1))
        else:
            self._logprobs = read_logprob_pairs(batch)
        return batch

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        pairs = self._logprobs
        rollouts = dataclasses.replace(self._rollouts, rollout_logprobs=pairs.rollout if pairs else [],
                                       actor_logprobs=pairs.actor if pairs else [])
        metrics.update(step_metrics(rollouts))
        try:
            self._guards.check_rollouts(self.global_steps, metrics, rollouts)
        except TrainingGuardError as error:
            self._stop(error, metrics)
        split = split_rollouts(batch.keys)
        metrics[f"{PREFIX}split_rollouts"] = split
        estimator = str(self.config.algorithm.adv_estimator)
        try:
            check_split_rollouts(self.global_steps, split, estimator=estimator,
                                 loss_agg_mode=str(self.config.actor_rollout_ref.actor.loss_agg_mode),
                                 kl_in_reward=bool(self.config.algorithm.use_kl_in_reward))
        except ConfigurationError as error:
            self._stop(TrainingGuardError(str(error), step=self.global_steps), metrics)
        batch = super()._compute_advantage(batch, metrics)
        if split and estimator == "rloo":  # verl runs RLOO over rows; GRPO it already counts per rollout
            batch = write_rollout_advantages(batch)
        metrics[f"{PREFIX}zero_advantage_group_share"] = zero_advantage_share(*read_advantages(batch))
        if self._records.keeps(self.global_steps):  # what this step trains on, with its advantages
            write_step_records(batch, self.global_steps, str(self.config.trainer.default_local_dir),
                               tokenizer=getattr(self, "tokenizer", None), max_rollouts=self._records.max_per_step,
                               with_logprobs=bool(OmegaConf.select(
                                   self.config, "actor_rollout_ref.rollout.calculate_log_probs", default=True)))
        return batch

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        result = super()._update_actor(batch, metrics)
        try:
            self._guards.check_update(self.global_steps, metrics)
        except TrainingGuardError as error:
            self._stop(error, metrics)
        return result

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> Any:
        result = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        metrics.update(self._weight_metrics)
        metrics.update(self._trainable)
        line = summary_line(global_steps, metrics)
        logger.info(line)
        print(line, flush=True)  # noqa: T201 - the console a user watches
        return result


class _GuardedTaskRunner(ray_actor_class(TaskRunnerV1)):  # type: ignore[misc]
    """verl's ``TaskRunnerV1``, in whose process the guarded trainer is registered (importing this module)."""


GuardedTaskRunner = ray.remote(num_cpus=1)(_GuardedTaskRunner)
"""The task runner ``rllm.training.verl.train`` hands to verl's ``run_ppo``."""
