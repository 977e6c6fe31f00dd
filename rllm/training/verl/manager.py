"""``StrandsAgentLoopManager``: verl's v1 agent-loop manager, made to stop a step that went wrong.

The pinned verl's v1 worker (``AgentLoopWorkerTQ``) runs every rollout as a fire-and-forget task: an
exception raised by an agent loop is logged and its prompt group marked ``failure`` (the missing
trajectories are padded downstream), and a rollout the loop drops (``run`` returned ``[]``) is
only logged. Neither stops training, so a bug every rollout hits, or a dead tool backend, would
train for hours on nothing.

This manager (set ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` to
``rllm.training.verl.manager.StrandsAgentLoopManager``; the recipe does) dispatches each batch
like verl's, but each worker waits for its rollouts and reports what became of every one
(``RolloutOutcome``, filled in by ``StrandsAgentLoop.run``). The manager then raises, failing the
step before anything is trained on it:

* ``SystemicFailureError`` naming the most common error and its count, when any rollout raised
  (a template error, a ``TypeError``, a tool backend refusing its credentials, ...);
* ``InfrastructureFailureRateError`` naming the most common cause, when more than
  ``rllm.max_infra_failure_share`` (default 0.5) of the batch's rollouts were dropped as
  infrastructure failures.

Every batch goes through it: training steps, DAPO refills and validation. Waiting for the rollouts
inside ``generate_sequences`` costs nothing with verl's synchronous trainer (``trainer.v1.trainer_mode:
rllm_sync``, the recipes', or verl's plain ``sync``), which waits for them anyway before sampling;
the asynchronous modes would lose their overlap, so it refuses them. State lives on the manager and
worker instances only. The private parts of verl's worker and manager it uses are listed in ``verl_internals``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from rllm.errors import ConfigurationError, InfrastructureFailureRateError, SystemicFailureError
from rllm.tracing.policy_server import PolicyServer
from rllm.training.verl.agent_loop import OUTCOME_KWARG, POLICY_SERVER_KWARG, RolloutOutcome
from rllm.training.verl.settings import read_settings
from rllm.training.verl.trainer.guards import GUARDED_MODE
from rllm.training.verl.verl_internals import SYNC_MODE, agent_loop_workers, ray_actor_class, use_agent_loop_worker

logger = logging.getLogger(__name__)


@dataclass
class BatchReport:
    """What became of one batch's rollouts, as one worker (or all of them, merged) saw it.

    Attributes:
        total: Rollouts run.
        dropped: Causes of the rollouts dropped as infrastructure failures, with their counts.
        errors: Errors that rollouts raised, with their counts.
    """

    total: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: RolloutOutcome) -> None:
        """Count one rollout."""
        self.total += 1
        if outcome.error:
            self.errors[outcome.error] += 1
        elif outcome.dropped:
            self.dropped[outcome.cause or "dropped"] += 1

    @classmethod
    def merge(cls, reports: list[BatchReport]) -> BatchReport:
        """One report for the whole batch."""
        merged = cls()
        for report in reports:
            merged.total += report.total
            merged.dropped.update(report.dropped)
            merged.errors.update(report.errors)
        return merged

    def check(self, max_infra_failure_share: float | None) -> None:
        """Raise if the batch must not be trained on (see the module docstring)."""
        if self.errors:
            cause, count = self.errors.most_common(1)[0]
            others = sum(self.errors.values()) - count
            if others:
                cause += f" (and {others} rollouts with other errors)"
            raise SystemicFailureError(cause, count)
        failures = sum(self.dropped.values())
        if max_infra_failure_share is not None and self.total and failures > max_infra_failure_share * self.total:
            cause, count = self.dropped.most_common(1)[0]
            raise InfrastructureFailureRateError(cause, cause_count=count, failures=failures, total=self.total,
                                                 max_share=max_infra_failure_share)


class StrandsAgentLoopWorker(ray_actor_class(AgentLoopWorkerTQ)):  # type: ignore[misc]
    """verl's v1 agent-loop worker whose ``generate_sequences`` waits for its rollouts and reports on them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcomes: dict[str, list[RolloutOutcome]] = {}
        self._policy_server = PolicyServer()  # serves agents on their own client; started by the first that needs it

    async def generate_sequences(self, batch: Any) -> BatchReport:  # type: ignore[override]
        """Run the batch's rollouts as verl does, wait for all of them, and report what became of each."""
        uids = [str(uid) for uid in batch["uid"]]
        before = set(self.background_tasks)
        await super().generate_sequences(batch)
        spawned = [task for task in self.background_tasks if task not in before]
        await asyncio.gather(*spawned, return_exceptions=True)  # verl's _run_prompt settles its own errors
        report = BatchReport()
        for uid in uids:
            for outcome in self._outcomes.pop(uid, []):
                report.add(outcome)
        return report

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *,
                              agent_name: str, trace: bool = True, **kwargs: Any) -> Any:
        outcome = RolloutOutcome()
        self._outcomes.setdefault(str(kwargs.get("uid")), []).append(outcome)
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **{OUTCOME_KWARG: outcome, POLICY_SERVER_KWARG: self._policy_server},
                                                 **kwargs)
        except Exception as error:
            if not outcome.error:
                outcome.error = f"{type(error).__name__}: {error}"
            raise

    async def _agent_loop_postprocess(self, output: Any, validate: Any, **kwargs: Any) -> Any:
        outcome = kwargs.pop(OUTCOME_KWARG, None)
        kwargs.pop(POLICY_SERVER_KWARG, None)  # verl stores the rest of kwargs with every row
        if isinstance(outcome, RolloutOutcome) and isinstance(output, list) and not output and not outcome.dropped:
            outcome.dropped, outcome.cause = True, "the agent loop returned no output"
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


class StrandsAgentLoopManager(AgentLoopManagerTQ):
    """``AgentLoopManagerTQ`` that fails a batch with a raising rollout or too many dropped ones.

    ``max_infra_failure_share`` comes from the config's ``rllm.max_infra_failure_share``
    (``rllm.training.verl.settings``: default 0.5; ``null``: never stop for dropped rollouts).
    """

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=GUARDED_MODE)
        if mode not in (GUARDED_MODE, SYNC_MODE):
            raise ConfigurationError(f"StrandsAgentLoopManager waits for each batch's rollouts, which only suits the "
                                     f"synchronous trainer (trainer.v1.trainer_mode={GUARDED_MODE}, got {mode!r}); "
                                     "unset actor_rollout_ref.rollout.agent.agent_loop_manager_class for the async "
                                     "modes")
        self.max_infra_failure_share = read_settings(config).max_infra_failure_share
        use_agent_loop_worker(self, StrandsAgentLoopWorker)
        self.last_report: BatchReport | None = None

    def generate_sequences(self, prompts: Any) -> None:
        """Dispatch the batch to the workers, wait for its rollouts, and raise if it must not be used."""
        workers = agent_loop_workers(self)
        chunks = prompts.chunk(len(workers))
        refs = [worker.generate_sequences.remote(chunk) for worker, chunk in zip(workers, chunks, strict=False)]
        self.check(ray.get(refs))

    def check(self, reports: list[BatchReport]) -> BatchReport:
        """Merge the workers' reports, log them, and raise if the batch must not be used."""
        report = BatchReport.merge(reports)
        self.last_report = report
        dropped = sum(report.dropped.values())
        if dropped:
            logger.warning("%d of %d rollouts dropped as infrastructure failures; most common: %s",
                           dropped, report.total, report.dropped.most_common(1)[0][0])
        try:
            report.check(self.max_infra_failure_share)
        except (SystemicFailureError, InfrastructureFailureRateError) as error:
            logger.error("stopping training: %s", error)
            raise
        return report
