"""``AgentWorkflowEngine``: every (task, rollout) run concurrently over a pool of workflow instances.

Guarantees:

* **Concurrency.** Up to ``n_parallel_tasks`` rollouts run at once, each on its own pooled
  workflow instance, reset before every run so a reused instance behaves like a fresh one.
* **Nothing lost.** Every (task, rollout) yields exactly one ``Episode``: a workflow that raises
  gives an ``ERROR`` (or the exception's typed reason) episode with the message in ``info``; one
  that runs past ``rollout_timeout`` is cancelled and gives a ``TIMEOUT`` episode.
* **Retries for infrastructure only.** A rollout ending with an infrastructure failure (engine
  unreachable, 5xx, timeouts) is rerun from a fresh reset up to ``retry_limit`` times; a wrong
  answer or any other reason is final. Failures left after the retries keep their reason and are
  reported apart from wrong answers, never scored as wrong. A cancelled rollout is final and
  never scored either (counted apart), nor is an unexpected error (``ERROR``, counted apart: a bug
  is not the policy's mistake).
* **Streaming and resume.** Each episode is appended to ``output_path`` (JSONL, one flushed line
  per episode, ``info`` carrying ``task_id``, ``rollout_index`` and ``attempts``) as it finishes.
  A rerun with the same path loads the finished pairs and runs only the rest; Ctrl-C keeps every
  line already written.
* **Order.** Results come back in task order, the rollouts of a task adjacent.
* **Failures that stop the run.** An unexpected error (``ERROR``: a bug, a misconfiguration such
  as a tool backend refusing its token) still gets its episode, written with its traceback; once
  the same error (exception type and message, with numbers, addresses and quoted values
  normalised) has ended ``max_same_errors`` rollouts the run stops with ``SystemicFailureError``.
  A circuit breaker stops it with ``InfrastructureFailureRateError`` (naming the most common
  cause) as soon as more than ``max_infra_failure_share`` of the batch's rollouts have ended as
  infrastructure failures after their retries, i.e. as soon as the share is certain to be
  exceeded, instead of scoring the rest. Either way the remaining rollouts are cancelled and
  awaited, and every episode that finished stays in ``output_path``; a rerun resumes from there.
"""

from __future__ import annotations

import asyncio
import logging
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError
from tqdm.auto import tqdm

from rllm.engine.rollout.base import RolloutEngine
from rllm.errors import InfrastructureFailureRateError, RLLMError, SystemicFailureError
from rllm.integrations.strands import describe_failure, termination_reason_for
from rllm.types import Episode, TerminationReason
from rllm.workflows.base import Workflow

logger = logging.getLogger(__name__)

_Key = tuple[str, int]


@dataclass
class RolloutStats:
    """Counts over finished episodes; accuracy leaves infrastructure failures, errors and cancelled episodes out."""

    total: int = 0
    correct: int = 0
    infrastructure_failures: int = 0
    cancelled: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, episode: Episode) -> None:
        """Count one episode."""
        self.total += 1
        reason = episode.termination_reason
        self.reasons[reason.value] += 1
        if reason.is_infrastructure_failure:
            self.infrastructure_failures += 1
        elif reason is TerminationReason.CANCELLED:
            self.cancelled += 1
        elif reason.is_scored and episode.is_correct:
            self.correct += 1

    @property
    def errors(self) -> int:
        """Episodes ended by an unexpected error (a bug or a misconfiguration): not scored, not infrastructure."""
        return self.reasons[TerminationReason.ERROR.value]

    @property
    def scored(self) -> int:
        """Episodes that count towards accuracy."""
        return self.total - self.infrastructure_failures - self.errors - self.cancelled

    @property
    def accuracy(self) -> float:
        """Correct over scored episodes (0 when none is scored)."""
        return self.correct / self.scored if self.scored else 0.0

    @property
    def failures(self) -> int:
        """Episodes that did not finish normally: infrastructure failures and errors."""
        return self.infrastructure_failures + self.errors


def summarize(episodes: list[Episode]) -> RolloutStats:
    """``RolloutStats`` of a list of episodes."""
    stats = RolloutStats()
    for episode in episodes:
        stats.add(episode)
    return stats


@dataclass
class _Job:
    task_index: int
    rollout_index: int
    task_id: str
    task: dict[str, Any]
    workflow: Workflow | None = None
    abandoned: bool = False  # the instance did not stop after cancellation: never reuse it

    @property
    def uid(self) -> str:
        return f"{self.task_id}:{self.rollout_index}"


def _rerun(episode: Episode) -> bool:
    """Whether a resumed run does a recorded pair again: infrastructure failures and errors."""
    reason = episode.termination_reason
    return reason.is_infrastructure_failure or reason is TerminationReason.ERROR


def _task_id(task: dict[str, Any], index: int) -> str:
    value = task.get("id") if isinstance(task, dict) else None
    return str(index) if value is None else str(value)


_NORMALISE = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"), "<uuid>"),
    (re.compile(r"'[^'\n]{0,80}'" + r'|"[^"\n]{0,80}"'), "'?'"),
    (re.compile(r"\d+(?:\.\d+)?"), "#"),
    (re.compile(r"\s+"), " "),
)


def error_signature(message: str) -> str:
    """``"Type: message"`` with addresses, ids, quoted values and numbers blanked out.

    Two rollouts ended by the same bug on different tasks (``KeyError: 'q-17'`` and
    ``KeyError: 'q-42'``) get the same signature.
    """
    text = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text[:300]


@dataclass
class _FailureMonitor:
    """Decides, episode by episode, whether the run must stop (see the module docstring)."""

    total: int
    max_same_errors: int | None
    max_infra_failure_share: float | None
    errors: dict[str, list[Episode]] = field(default_factory=dict)
    infra: dict[str, list[Episode]] = field(default_factory=dict)
    example: Episode | None = None  # the first episode of the cause that stopped the run

    def add(self, episode: Episode, *, resumed: bool = False) -> RLLMError | None:
        """Count one finished episode; the error to stop with, if a limit is now crossed."""
        reason = episode.termination_reason
        cause = str(episode.info.get("error") or reason.value)
        if reason.is_infrastructure_failure:
            self.infra.setdefault(error_signature(cause), []).append(episode)
            failures = sum(len(group) for group in self.infra.values())
            limit = self.max_infra_failure_share
            if limit is not None and failures > limit * self.total:
                group = max(self.infra.values(), key=len)
                self.example = group[0]
                return InfrastructureFailureRateError(
                    str(group[0].info.get("error") or group[0].termination_reason.value), cause_count=len(group),
                    failures=failures, total=self.total, max_share=limit)
        elif reason is TerminationReason.ERROR and not resumed:
            group = self.errors.setdefault(error_signature(cause), [])
            group.append(episode)
            if len(group) == 1:  # each distinct cause once, where the user reads the run (it is in info too)
                logger.warning("%s ended on an error, not scored (a bug or a misconfiguration): %s", episode.id, cause)
            if self.max_same_errors is not None and len(group) >= self.max_same_errors:
                self.example = group[0]
                return SystemicFailureError(str(group[0].info.get("error") or cause), len(group),
                                            [e.id for e in group])
        return None


class AgentWorkflowEngine:
    """Runs ``workflow_cls(rollout_engine, **workflow_args)`` over tasks x rollouts, concurrently.

    Args:
        workflow_cls: A ``Workflow`` subclass.
        workflow_args: Keyword arguments of every instance (tools, system prompt, reward, ...).
        rollout_engine: Engine shared by all instances.
        n_parallel_tasks: Pool size, i.e. how many rollouts run at once.
        retry_limit: Reruns of a rollout that ended with an infrastructure failure.
        rollout_timeout: Seconds one attempt may take; ``None``: no limit.
        output_path: JSONL file episodes stream to and resume from; ``None``: keep in memory only.
        progress: Show a progress bar (done / total, running accuracy, failures).
        retry_backoff: Seconds before the first rerun, doubling after each.
        cancel_grace: Seconds a timed-out or cancelled run gets to unwind after cancellation; an
            instance that has not stopped by then is dropped from the pool and replaced by a new one.
        rerun_failed_on_resume: On resume, run again the pairs recorded as infrastructure failures
            or errors (the bug that stopped the previous run may be fixed).
        max_same_errors: Stop with ``SystemicFailureError`` once the same unexpected error has
            ended this many rollouts; ``None``: never stop for errors.
        max_infra_failure_share: Stop with ``InfrastructureFailureRateError`` once more than this
            share of the batch's rollouts have ended as infrastructure failures (after retries);
            ``None``: never.
    """

    def __init__(
        self,
        workflow_cls: type[Workflow],
        workflow_args: dict[str, Any] | None,
        rollout_engine: RolloutEngine,
        n_parallel_tasks: int = 64,
        retry_limit: int = 3,
        rollout_timeout: float | None = None,
        output_path: str | Path | None = None,
        progress: bool = True,
        *,
        retry_backoff: float = 1.0,
        cancel_grace: float = 5.0,
        rerun_failed_on_resume: bool = True,
        max_same_errors: int | None = 3,
        max_infra_failure_share: float | None = 0.5,
    ) -> None:
        if n_parallel_tasks < 1:
            raise ValueError(f"n_parallel_tasks must be at least 1, got {n_parallel_tasks}")
        if retry_limit < 0:
            raise ValueError(f"retry_limit must be at least 0, got {retry_limit}")
        if rollout_timeout is not None and rollout_timeout <= 0:
            raise ValueError(f"rollout_timeout must be positive, got {rollout_timeout}")
        if max_same_errors is not None and max_same_errors < 1:
            raise ValueError(f"max_same_errors must be at least 1 (or None), got {max_same_errors}")
        if max_infra_failure_share is not None and not 0 <= max_infra_failure_share <= 1:
            raise ValueError(f"max_infra_failure_share must be between 0 and 1 (or None), "
                             f"got {max_infra_failure_share}")
        self.workflow_cls = workflow_cls
        self.workflow_args = dict(workflow_args or {})
        self.rollout_engine = rollout_engine
        self.n_parallel_tasks = n_parallel_tasks
        self.retry_limit = retry_limit
        self.rollout_timeout = rollout_timeout
        self.output_path = Path(output_path) if output_path is not None else None
        self.progress = progress
        self.retry_backoff = retry_backoff
        self.cancel_grace = cancel_grace
        self.rerun_failed_on_resume = rerun_failed_on_resume
        self.max_same_errors = max_same_errors
        self.max_infra_failure_share = max_infra_failure_share
        self.stats = RolloutStats()
        self._idle: list[Workflow] = []
        self._n_instances = 0

    # ------------------------------------------------------------------ pool
    def _new_instance(self) -> Workflow:
        return self.workflow_cls(self.rollout_engine, **self.workflow_args)

    async def _acquire(self, pool: asyncio.Queue[Workflow]) -> Workflow:
        if pool.empty() and self._n_instances < self.n_parallel_tasks:
            self._n_instances += 1
            try:
                return self._new_instance()
            except BaseException:
                self._n_instances -= 1
                raise
        return await pool.get()

    # ------------------------------------------------------------------ resume
    def _load_finished(self) -> dict[_Key, Episode]:
        """Episodes already in ``output_path``, the last line of each pair winning."""
        done: dict[_Key, Episode] = {}
        if self.output_path is None or not self.output_path.exists():
            return done
        with self.output_path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    episode = Episode.model_validate_json(line)
                    key = (str(episode.info["task_id"]), int(episode.info["rollout_index"]))
                except (ValidationError, KeyError, TypeError, ValueError) as error:
                    logger.warning("%s:%d: skipping an unreadable episode line (%s)", self.output_path, lineno,
                                   str(error).splitlines()[0])
                    continue
                done[key] = episode
        if self.rerun_failed_on_resume:
            done = {k: e for k, e in done.items() if not _rerun(e)}
        return done

    def _stopped(self, error: RLLMError, example: Episode | None, done: int, total: int) -> None:
        """Say loudly why the run stops, with the traceback of the first rollout the cause ended."""
        kept = f"; the {done} finished episodes are in {self.output_path}" if self.output_path else ""
        logger.error("stopping the run after %d of %d rollouts%s: %s", done, total, kept, error)
        if example is not None and example.info.get("traceback"):
            logger.error("traceback of %s:\n%s", example.id, example.info["traceback"])

    def _open_output(self) -> IO[str] | None:
        if self.output_path is None:
            return None
        self.output_path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = self.output_path.exists() and self.output_path.stat().st_size > 0
        if needs_newline:
            with self.output_path.open("rb") as f:
                f.seek(-1, 2)
                needs_newline = f.read(1) != b"\n"
        out = self.output_path.open("a", encoding="utf-8")
        if needs_newline:  # a line cut off by a crash stays on its own (and is skipped on load)
            out.write("\n")
        return out

    # ------------------------------------------------------------------ running
    async def execute_tasks(self, tasks: list[dict[str, Any]], n_rollouts: int = 1) -> list[Episode]:
        """Run every task ``n_rollouts`` times; episodes in task order, a task's rollouts adjacent."""
        if n_rollouts < 1:
            raise ValueError(f"n_rollouts must be at least 1, got {n_rollouts}")
        ids = [_task_id(task, index) for index, task in enumerate(tasks)]
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        if duplicates:
            raise ValueError(f"task ids must be unique; repeated: {duplicates[:5]}")
        jobs = [_Job(t, r, ids[t], tasks[t]) for t in range(len(tasks)) for r in range(n_rollouts)]
        finished = self._load_finished()
        results: dict[_Key, Episode] = {}
        pending: list[_Job] = []
        for job in jobs:
            key = (job.task_id, job.rollout_index)
            if key in finished:
                results[key] = finished[key]
            else:
                pending.append(job)
        if results:
            logger.info("resuming from %s: %d of %d rollouts already done", self.output_path, len(results), len(jobs))
        self.stats = summarize(list(results.values()))
        if pending and self._n_instances == 0:  # fail on a bad workflow config before any work
            self._idle.append(self._new_instance())
            self._n_instances = 1

        pool: asyncio.Queue[Workflow] = asyncio.Queue()
        for instance in self._idle:
            pool.put_nowait(instance)
        self._idle.clear()
        monitor = _FailureMonitor(len(jobs), self.max_same_errors, self.max_infra_failure_share)
        for episode in results.values():
            monitor.add(episode, resumed=True)
        out = self._open_output()
        bar = tqdm(total=len(jobs), initial=len(results), desc="rollouts", unit="ep", disable=not self.progress,
                   dynamic_ncols=True)
        self._update_bar(bar)

        async def run_job(job: _Job) -> None:
            job.workflow = await self._acquire(pool)
            try:
                episode = await self._run_with_retries(job)
            finally:
                if job.workflow is not None:
                    if job.abandoned:
                        logger.warning("%s: the workflow instance did not stop after cancellation; dropping it",
                                       job.uid)
                        self._n_instances -= 1
                    else:
                        pool.put_nowait(job.workflow)
            results[(job.task_id, job.rollout_index)] = episode
            if out is not None:
                out.write(episode.model_dump_json() + "\n")
                out.flush()
            self.stats.add(episode)
            bar.update(1)
            self._update_bar(bar)
            stop = monitor.add(episode)
            if stop is not None:
                raise stop

        running = [asyncio.ensure_future(run_job(job)) for job in pending]
        try:
            if running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_EXCEPTION)
                failed = next((t for t in running if t in done and not t.cancelled() and t.exception()), None)
                if failed is not None:
                    raise failed.exception()  # type: ignore[misc]
        except BaseException as error:
            # Cancel what is still running and wait for it to unwind, so no instance is left mid-run
            # and every episode that finished is already written.
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if isinstance(error, RLLMError):
                self._stopped(error, monitor.example, len(results), len(jobs))
            else:
                logger.warning("interrupted: %d of %d rollouts finished%s", len(results), len(jobs),
                               f" and kept in {self.output_path}" if self.output_path else "")
            raise
        finally:
            bar.close()
            if out is not None:
                out.close()
            while not pool.empty():
                self._idle.append(pool.get_nowait())
        return [results[(job.task_id, job.rollout_index)] for job in jobs]

    def _update_bar(self, bar: tqdm) -> None:
        stats = self.stats
        bar.set_postfix(acc=f"{stats.accuracy:.3f}", failed=stats.failures, refresh=False)

    async def _run_with_retries(self, job: _Job) -> Episode:
        """One episode for ``job`` on ``job.workflow``: infrastructure failures rerun up to ``retry_limit`` times.

        An instance that does not stop after a timeout is replaced; ``job.workflow`` is then the
        replacement, or ``None`` if none could be built.
        """
        attempt = 0
        while True:
            attempt += 1
            assert job.workflow is not None
            episode, healthy = await self._attempt(job.workflow, job)
            if not healthy:
                logger.warning("%s: the workflow instance did not stop after cancellation; replacing it", job.uid)
                self._n_instances -= 1
                job.workflow = None
                try:
                    job.workflow = self._new_instance()
                    self._n_instances += 1
                except Exception as error:  # noqa: BLE001 - the episode is already recorded
                    logger.error("could not build a replacement workflow instance: %s", describe_failure(error))
            reason = episode.termination_reason
            if not reason.is_infrastructure_failure or attempt > self.retry_limit or job.workflow is None:
                break
            delay = self.retry_backoff * 2 ** (attempt - 1)
            logger.warning("%s: %s (%s); retry %d of %d in %.1fs", job.uid, reason.value,
                           episode.info.get("error", ""), attempt, self.retry_limit, delay)
            await asyncio.sleep(delay)
        episode.id = job.uid
        if episode.task is None:
            episode.task = job.task
        episode.info.update(task_id=job.task_id, rollout_index=job.rollout_index, attempts=attempt)
        return episode

    async def _attempt(self, workflow: Workflow, job: _Job) -> tuple[Episode, bool]:
        """Run once from a fresh reset; returns the episode and whether the instance may be reused."""
        try:
            workflow.reset()
        except Exception as error:  # noqa: BLE001
            return self._failed(workflow, job, TerminationReason.ERROR, error), False
        run = asyncio.ensure_future(workflow.run(job.task, job.uid))
        try:
            done, _ = await asyncio.wait({run}, timeout=self.rollout_timeout)
        except asyncio.CancelledError:
            run.cancel()
            stopped, _ = await asyncio.wait({run}, timeout=self.cancel_grace)
            job.abandoned = not stopped
            raise
        if run in done:
            if run.cancelled():
                return self._failed(workflow, job, TerminationReason.CANCELLED, "the run was cancelled"), True
            failure = run.exception()
            if failure is not None:
                return self._failed(workflow, job, termination_reason_for(failure), failure), True
            episode = run.result()
            if not isinstance(episode, Episode):
                message = f"{type(workflow).__name__}.run returned {type(episode).__name__}, not an Episode"
                return self._failed(workflow, job, TerminationReason.ERROR, message), True
            return episode, True
        run.cancel()
        stopped, _ = await asyncio.wait({run}, timeout=self.cancel_grace)
        message = f"the rollout exceeded its {self.rollout_timeout}s timeout"
        return self._failed(workflow, job, TerminationReason.TIMEOUT, message), bool(stopped)

    def _failed(self, workflow: Workflow, job: _Job, reason: TerminationReason, error: BaseException | str) -> Episode:
        """The workflow's partial episode for a failed run, or a bare one if even that fails."""
        message = error if isinstance(error, str) else describe_failure(error)
        try:
            episode = workflow.failed_episode(job.task, job.uid, reason, message)
        except Exception as inner:  # noqa: BLE001
            logger.error("%s.failed_episode raised %s", type(workflow).__name__, describe_failure(inner))
            episode = Episode(id=job.uid, task=job.task, termination_reason=reason, info={"error": message})
        if isinstance(error, BaseException) and reason is TerminationReason.ERROR:
            episode.info["traceback"] = "".join(traceback.format_exception(error))[-4000:]
        return episode
