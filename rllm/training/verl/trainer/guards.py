"""Guards that say when verl training has stopped being real: a metric each per step, and a stop when violated.

Each way training can go on looking healthy while learning nothing is measured on every step from the
batch verl trained on, logged under ``rllm/guard/`` beside verl's metrics, and checked against the
recipe's ``rllm.guards`` block (``GuardSettings``, read by ``rllm.training.verl.settings``; on by
default; ``null`` turns one off; a guard that is on but cannot read what it checks stops the step):
the log-prob gap between the rollout and the actor (``max_logprob_gap``, audited on
``logprob_audit_rollouts`` in verl's bypass mode), group integrity (always: a group is verl's ``uid``
and the row's own prompt, not every token of a system prompt a factory may vary),
``min_rollouts_per_group``, ``max_truncated_share``, ``max_context_overflow_share``,
``max_steps_without_signal`` (with a warning at the first step without a learning signal, and
``check_run_end`` failing a run that never had one, or that checked no step), ``max_steps_without_tool_calls``
(an agent with tools that never calls one: a parser that never matches the model's format; a warning at the
first step), ``max_malformed_tool_call_share`` (over ``max_steps_with_malformed_tool_calls`` steps in a row, each
with at least ``min_tool_calls_for_malformed_stop`` calls; a warning at the first step over the share), tool
calls falling to zero (a warning), most rollouts split at every call (a warning), and a non-finite loss,
entropy or NaN gradient norm (always). A stop on a run of steps names the steps and what each saw.
``GuardedTrainer`` (``rllm.training.verl.trainer.runner``) calls them; the table of guards, their metrics and the
faults that show each one stopping verl's trainer is in docs/training-verl.md.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllm.errors import TrainingGuardError
from rllm.training.verl.settings import GuardSettings

logger = logging.getLogger(__name__)

GUARDED_MODE = "rllm_sync"
"""``trainer.v1.trainer_mode`` under which the guards run: verl's synchronous trainer with rllm's guards
(``rllm.training.verl.trainer.runner.GuardedTrainer``); verl's own ``sync`` runs without them."""
PREFIX = "rllm/guard/"
"""Prefix of the guard metrics in verl's logged metrics."""

_LOSS_METRICS = ("actor/loss", "actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/entropy")
"""What the pinned verl's v1 trainer logs for the update: ``actor/loss`` is the loss it backpropagates (``pg_loss``
minus ``entropy_coeff * entropy_loss`` plus ``kl_loss_coef * kl_loss``; the last two only when computed), and
``actor/entropy`` the token-mean entropy of the step's responses (only when verl recomputes log-probs)."""
_GRAD_NORM = "actor/grad_norm"
"""NaN stops; infinite does not: with fp16 on a GPU the grad scaler's early overflows give an infinite norm for an
update it then skips."""


@dataclass(frozen=True)
class RolloutCounts:
    """What the agent loop reported of one rollout beyond its reward (its ``extra_fields``).

    Attributes:
        model_calls: Sampled turns.
        samples: Samples the rollout came back as.
        tools: Tools its agent (a team's agents together) had.
        malformed_tool_calls: Tool calls the parser found malformed (among its tool calls).
        side_calls: Calls on the agent's model outside its turns (a context manager's summary).
        discarded_answers: Answers the agent discarded (masked, never trained as acted upon).
        rewritten_calls: Calls whose history was rewritten (each started a sample).
    """

    model_calls: float = 0.0
    samples: float = 1.0
    tools: int | None = None
    malformed_tool_calls: float = 0.0
    side_calls: float = 0.0
    discarded_answers: float = 0.0
    rewritten_calls: float = 0.0


@dataclass
class StepRollouts:
    """What the guards read of one step's batch, a row per rollout.

    Attributes:
        groups: Each rollout's group (verl's ``uid``).
        rewards: Each rollout's reward (its ``rm_scores`` summed).
        prompts: Each rollout's first prompt, as token ids (compared within a group where no task is reported).
        tasks: Each rollout's task: a key of its row's own prompt (rollouts of one group must share
            it), ``None`` where the loop reported none.
        rows: Each rollout's dataset row (``extra_info.index``), ``None`` where the row has none.
        rollout_logprobs: Per compared rollout, the log-probs its tokens were sampled with (sampled tokens only).
        actor_logprobs: Per compared rollout, the actor's log-probs of the same tokens.
        truncated: Per rollout, whether its response was cut at ``response_length`` (``None``: not reported).
        tool_calls: Per rollout, its tool calls (``None`` where the loop did not report them).
        endings: Per rollout, its termination reason (``None`` where not reported).
        counts: Per rollout, what else the loop reported (``None`` where it reported nothing).
        rollouts_per_prompt: verl's ``rollout.n`` (``None``: not checked).
    """

    groups: Sequence[Any]
    rewards: Sequence[float]
    prompts: Sequence[Sequence[int]] = field(default_factory=list)
    rows: Sequence[Any] = field(default_factory=list)
    rollout_logprobs: Sequence[Sequence[float]] = field(default_factory=list)
    actor_logprobs: Sequence[Sequence[float]] = field(default_factory=list)
    truncated: Sequence[bool | None] = field(default_factory=list)
    tool_calls: Sequence[float | None] = field(default_factory=list)
    tasks: Sequence[Any] = field(default_factory=list)
    endings: Sequence[str | None] = field(default_factory=list)
    counts: Sequence[RolloutCounts | None] = field(default_factory=list)
    rollouts_per_prompt: int | None = None


def _task_key(rollouts: StepRollouts, index: int) -> Any:
    """The rollout's task (its row's prompt) as the loop reported it, else its first prompt's tokens."""
    task = rollouts.tasks[index] if index < len(rollouts.tasks) else None
    if task is None and index < len(rollouts.prompts):
        task = tuple(rollouts.prompts[index])
    return task


def _spread(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, set[Any]]:
    """Each key that comes with more than one value, with its values, in the order the keys first came."""
    found: dict[Any, set[Any]] = defaultdict(set)
    for key, value in pairs:
        found[key].add(value)
    return {key: values for key, values in found.items() if len(values) > 1}


def group_violations(rollouts: StepRollouts) -> list[str]:
    """What is wrong with the step's RLOO groups: mixed prompts, split prompts, oversized groups (empty: nothing).

    A group's rollouts must share their task (the row's own prompt), not every token of their first
    prompt: a factory may vary its system prompt per rollout, a ``Graph`` order its entry nodes.
    """
    problems = []
    tasks = ((group, _task_key(rollouts, index)) for index, group in enumerate(rollouts.groups))
    mixed = _spread((group, task) for group, task in tasks if task is not None)
    if mixed:
        group, found = next(iter(mixed.items()))
        problems.append(f"group {group} holds rollouts of {len(found)} different prompts ({len(mixed)} such group(s))")
    split = _spread((row, group) for group, row in zip(rollouts.groups, rollouts.rows, strict=False) if row is not None)
    if split:
        row, found = next(iter(split.items()))
        problems.append(f"the rollouts of dataset row {row} are split across {len(found)} groups "
                        f"({len(split)} such row(s))")
    if rollouts.rollouts_per_prompt is not None:
        sizes = Counter(rollouts.groups)
        oversized = [group for group, size in sizes.items() if size > rollouts.rollouts_per_prompt]
        if oversized:
            problems.append(f"group {oversized[0]} has {sizes[oversized[0]]} rollouts, more than rollout.n="
                            f"{rollouts.rollouts_per_prompt}")
    return problems


def step_metrics(rollouts: StepRollouts) -> dict[str, float]:
    """The guard metrics of one step (``rllm/guard/...``)."""
    metrics: dict[str, float] = {}
    by_group: dict[Any, list[float]] = defaultdict(list)
    for group, reward in zip(rollouts.groups, rollouts.rewards, strict=True):
        by_group[group].append(float(reward))
    sizes = [len(v) for v in by_group.values()]
    varied = [len(set(v)) > 1 for v in by_group.values()]
    metrics[f"{PREFIX}groups"] = float(len(by_group))
    metrics[f"{PREFIX}min_group_size"] = float(min(sizes)) if sizes else 0.0
    metrics[f"{PREFIX}groups_with_signal_share"] = sum(varied) / len(varied) if varied else 0.0
    metrics[f"{PREFIX}group_violations"] = float(len(group_violations(rollouts)))
    gaps = [abs(a - b) for rollout, actor in zip(rollouts.rollout_logprobs, rollouts.actor_logprobs, strict=True)
            for a, b in zip(rollout, actor, strict=True)]
    if gaps:
        metrics[f"{PREFIX}logprob_gap_rollouts"] = float(len(rollouts.rollout_logprobs))
        metrics[f"{PREFIX}logprob_gap_mean"] = sum(gaps) / len(gaps)
        metrics[f"{PREFIX}logprob_gap_max"] = max(gaps)
    reported = [t for t in rollouts.truncated if t is not None]
    if reported and len(reported) == len(rollouts.truncated):
        metrics[f"{PREFIX}truncated_share"] = sum(map(bool, reported)) / len(reported)
    calls = [c for c in rollouts.tool_calls if c is not None]
    if calls:
        metrics[f"{PREFIX}tool_calls_per_episode"] = sum(calls) / len(calls)
    endings = list(rollouts.endings)
    if endings and all(e is not None for e in endings):
        metrics[f"{PREFIX}context_overflow_share"] = endings.count("context_overflow") / len(endings)
    metrics.update(_agent_metrics(rollouts))
    return metrics


def _agent_metrics(rollouts: StepRollouts) -> dict[str, float]:
    """The metrics of what the agents did with their tools and histories (from ``RolloutCounts``)."""
    pairs = [(c, calls) for c, calls in zip(rollouts.counts, rollouts.tool_calls, strict=False) if c is not None]
    if not pairs:
        return {}
    metrics = {f"{PREFIX}side_calls": sum(c.side_calls for c, _ in pairs),
               f"{PREFIX}discarded_answers": sum(c.discarded_answers for c, _ in pairs)}
    with_tools = [calls or 0.0 for c, calls in pairs if c.tools]
    if with_tools:
        metrics[f"{PREFIX}tool_agent_rollouts"] = float(len(with_tools))
        metrics[f"{PREFIX}tool_agent_calls_per_episode"] = sum(with_tools) / len(with_tools)
    all_calls = sum(calls or 0.0 for _, calls in pairs)
    if all_calls:
        malformed = min(sum(c.malformed_tool_calls for c, _ in pairs), all_calls)
        metrics[f"{PREFIX}tool_calls"] = all_calls
        metrics[f"{PREFIX}malformed_tool_calls"] = malformed
        metrics[f"{PREFIX}malformed_tool_call_share"] = malformed / all_calls
    model_calls = sum(c.model_calls for c, _ in pairs)
    if model_calls:
        metrics[f"{PREFIX}rewritten_call_share"] = sum(c.rewritten_calls for c, _ in pairs) / model_calls
    several = [c for c, _ in pairs if c.model_calls > 1]
    if several:  # a call after the first that kept the history appended would not have been rewritten
        every = [c.rewritten_calls >= c.model_calls - 1 for c in several]
        metrics[f"{PREFIX}split_every_call_share"] = sum(every) / len(every)
    return metrics


def zero_advantage_share(groups: Sequence[Any], advantages: Sequence[Sequence[float]]) -> float:
    """The share of groups in which every rollout's advantage is 0 on every token (no gradient from them)."""
    zero: dict[Any, bool] = {}
    for group, values in zip(groups, advantages, strict=True):
        zero[group] = zero.get(group, True) and all(v == 0 for v in values)
    return sum(zero.values()) / len(zero) if zero else 0.0


_SHOWN_STEPS = 10
"""Most steps of a run a stop's message lists one by one (the latest; the run's length is always said)."""


def _evidence(run: Sequence[tuple[int, str]], what: str) -> str:
    """``run``'s steps and what each saw: ``steps 3-5: 0 of 2, 0 of 2, 0 of 2 groups ...``."""
    steps = [step for step, _ in run]
    consecutive = steps == list(range(steps[0], steps[0] + len(steps)))
    named = (f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}" if consecutive
             else "steps " + ", ".join(map(str, steps)))
    shown = [seen for _, seen in run[-_SHOWN_STEPS:]]
    more = "..., " if len(run) > _SHOWN_STEPS else ""
    return f"{named}: {more}{', '.join(shown)} {what}"


class TrainingGuards:
    """Checks each step's metrics against ``GuardSettings``; stops with ``TrainingGuardError`` naming the step.

    The guards that stop on a run of steps (no learning signal, tools never called, malformed calls) keep
    the run they are in, each step with what it saw, and name them in the stop's message.
    """

    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.steps_with_signal = 0
        self.steps_checked = 0
        self.tools_were_used = False
        self.tool_steps_checked = 0
        self.warned_split_every_call = False
        self.warned_malformed = False
        self._without_signal: list[tuple[int, str]] = []
        self._without_tool_calls: list[tuple[int, str]] = []
        self._malformed: list[tuple[int, str]] = []

    @property
    def steps_without_signal(self) -> int:
        """Steps in a row, up to the last checked, in which no group's rewards varied."""
        return len(self._without_signal)

    @property
    def steps_without_tool_calls(self) -> int:
        """Steps in a row, up to the last checked, in which agents with tools called none."""
        return len(self._without_tool_calls)

    @property
    def steps_with_malformed_tool_calls(self) -> int:
        """Steps in a row, up to the last checked, that count toward the malformed-call stop."""
        return len(self._malformed)

    def check(self, step: int, metrics: dict[str, Any], rollouts: StepRollouts | None = None) -> list[str]:
        """Both checks of a step (``check_update`` then ``check_rollouts``); the warnings."""
        self.check_update(step, metrics)
        return self.check_rollouts(step, metrics, rollouts)

    def check_update(self, step: int, metrics: dict[str, Any]) -> None:
        """Raise when the update's loss or entropy is NaN or infinite, its gradient norm NaN, or no loss was logged."""
        present = [name for name in _LOSS_METRICS if metrics.get(name) is not None]
        if not present:
            raise TrainingGuardError(f"step {step}: verl logged no loss for the update ({', '.join(_LOSS_METRICS)}); "
                                     "the NaN guard cannot read it", step=step)
        for name in present:
            value = float(metrics[name])
            if not math.isfinite(value):
                raise TrainingGuardError(f"step {step}: {name} is {value}; stopping instead of training on it "
                                         "(fp16 overflow? see docs/training-verl.md, Precision)", step=step)
        norm = metrics.get(_GRAD_NORM)
        if norm is not None and math.isnan(float(norm)):
            raise TrainingGuardError(f"step {step}: {_GRAD_NORM} is nan: the update's gradient is not a number",
                                     step=step)

    def _over(self, step: int, metrics: dict[str, Any], name: str, setting: str) -> Any:
        """The step's metric ``name`` when it is over ``rllm.guards.<setting>``; ``None`` when within it or off."""
        limit = getattr(self.settings, setting)
        if limit is None:
            return None
        value = self._require(step, metrics, name, setting)
        return value if value > limit else None

    def _require(self, step: int, metrics: dict[str, Any], name: str, setting: str) -> Any:
        value = metrics.get(f"{PREFIX}{name}")
        if value is None:
            raise TrainingGuardError(f"step {step}: the guard rllm.guards.{setting} is on but the step has no "
                                     f"{PREFIX}{name} to check; turn it off explicitly (null) if that is meant",
                                     step=step)
        return value

    def check_groups(self, step: int, rollouts: StepRollouts) -> None:
        """Raise on wrong RLOO groups or a group too small for its baseline, before anything runs on the batch."""
        problems = group_violations(rollouts)
        if problems:
            raise TrainingGuardError(f"step {step}: the RLOO groups are wrong: {'; '.join(problems)}; the "
                                     "advantages would compare rollouts of different prompts", step=step)
        smallest = min(Counter(rollouts.groups).values(), default=None)
        if (stop := self._group_size_stop(step, smallest)) is not None:
            raise TrainingGuardError(stop, step=step)

    def with_other_stops(self, error: TrainingGuardError, metrics: dict[str, Any]) -> TrainingGuardError:
        """``error`` (a step's groups, found before its log-probs) naming every other rollout stop of the step too.

        A stop on the groups comes before the actor reads the batch, so the log-prob guard is not checked; the
        others (cut responses, tool use, reward signal, ...) are, so the user learns every reason at once.
        """
        step = error.step if error.step is not None else 0
        stops, _ = self._rollout_stops(step, metrics, logprobs=False)
        others = [stop for stop in stops if stop != str(error)]
        return TrainingGuardError("".join([str(error), *(f"\nalso {stop}" for stop in others)]), step=error.step)

    def _group_size_stop(self, step: int, smallest: float | None) -> str | None:
        minimum = self.settings.min_rollouts_per_group
        if smallest is None or minimum is None or smallest >= minimum:
            return None
        return (f"step {step}: a group has {int(smallest)} rollout(s); RLOO needs at least {minimum} per prompt for "
                "its baseline (actor_rollout_ref.rollout.n)")

    def check_rollouts(self, step: int, metrics: dict[str, Any], rollouts: StepRollouts | None = None) -> list[str]:
        """Raise on violated rollout guards (before the update), naming every one that holds; return the warnings.

        Wrong groups stop at once (nothing else is read of such a batch). The other guards are all checked, so
        one stop names every reason the step gave (``also step N: ...``); the warnings are logged.
        """
        if rollouts is not None:
            self.check_groups(step, rollouts)
        stops, warnings = self._rollout_stops(step, metrics)
        for warning in warnings:
            logger.warning("training guard: %s", warning)
        if stops:
            raise TrainingGuardError("".join([stops[0], *(f"\nalso {stop}" for stop in stops[1:])]), step=step)
        return warnings

    def _rollout_stops(self, step: int, metrics: dict[str, Any], logprobs: bool = True) -> tuple[list[str], list[str]]:
        """The stops and the warnings the step's rollout metrics give (the log-prob guard only if ``logprobs``)."""
        s, warnings, stops = self.settings, [], []
        if (small := self._group_size_stop(step, metrics.get(f"{PREFIX}min_group_size"))) is not None:
            stops.append(small)
        if logprobs and (gap := self._over(step, metrics, "logprob_gap_mean", "max_logprob_gap")) is not None:
            stops.append(
                f"step {step}: the rollout sampled with log-probs {gap:.3g} away from the actor's on average "
                f"(max {metrics.get(f'{PREFIX}logprob_gap_max', float('nan')):.3g}; rllm.guards.max_logprob_gap="
                f"{s.max_logprob_gap}): the served weights are not the ones being trained")
        if (truncated := self._over(step, metrics, "truncated_share", "max_truncated_share")) is not None:
            stops.append(
                f"step {step}: {truncated:.0%} of the responses were cut at response_length "
                f"(rllm.guards.max_truncated_share={s.max_truncated_share}); raise data.max_response_length "
                "or lower the agent's budget")
        signal = metrics.get(f"{PREFIX}groups_with_signal_share")
        if signal is not None:
            self.steps_checked += 1
            self.steps_with_signal += signal > 0
            groups = metrics.get(f"{PREFIX}groups")
            self._without_signal = [*self._without_signal, (step, f"0 of {groups:.0f}" if groups is not None
                                                            else "0")] if signal == 0 else []
            if self.steps_checked == 1 and signal == 0 and s.max_steps_without_signal is not None:
                warnings.append(f"step {step}: every group's rollouts got the same reward, so every advantage is "
                                "zero and this step trains nothing (no learning signal); check the reward function "
                                "on this policy's answers")
            if s.max_steps_without_signal is not None and self.steps_without_signal >= s.max_steps_without_signal:
                stops.append(
                    f"step {step}: the reward was the same for every rollout of every group for "
                    f"{self.steps_without_signal} step(s) in a row: no learning signal "
                    f"(rllm.guards.max_steps_without_signal={s.max_steps_without_signal}); "
                    f"{_evidence(self._without_signal, 'groups had rewards that varied')}")
        calls = metrics.get(f"{PREFIX}tool_calls_per_episode")
        if calls is not None:
            if calls > 0:
                self.tools_were_used = True
            elif self.tools_were_used and s.warn_on_tool_collapse:
                warnings.append(f"step {step}: tool calls per episode fell to zero (they were above zero before)")
        if (overflow := self._over(step, metrics, "context_overflow_share", "max_context_overflow_share")) is not None:
            stops.append(
                f"step {step}: {overflow:.0%} of the rollouts ended context_overflow, their history longer than "
                f"rollout.prompt_length even after the conversation manager trimmed it "
                f"(rllm.guards.max_context_overflow_share={s.max_context_overflow_share}); raise "
                "data.max_prompt_length or have the conversation manager keep less")
        warnings += self._check_tool_use(step, metrics, stops)
        return stops, warnings

    def _check_tool_use(self, step: int, metrics: dict[str, Any], stops: list[str]) -> list[str]:
        """Add a stop when agents with tools never call one, or calls are malformed step after step; warn first."""
        s, warnings = self.settings, []
        calls = metrics.get(f"{PREFIX}tool_agent_calls_per_episode")
        limit = s.max_steps_without_tool_calls
        if calls is not None and limit is not None:
            self.tool_steps_checked += 1
            rollouts = metrics.get(f"{PREFIX}tool_agent_rollouts")
            self._without_tool_calls = [*self._without_tool_calls, (step, f"{rollouts:.0f}" if rollouts is not None
                                                                    else "?")] if calls == 0 else []
            cause = ("the tool parser (actor_rollout_ref.rollout.multi_turn.format) does not match how the model "
                     "writes calls under its chat template, or the template does not show the model its tools")
            if self.steps_without_tool_calls >= limit:
                stops.append(
                    f"step {step}: agents with tools called none in {self.steps_without_tool_calls} step(s) in a row "
                    f"(rllm.guards.max_steps_without_tool_calls={limit}): likely {cause}; the reward it gets is "
                    f"not from using its tools; {_evidence(self._without_tool_calls, 'rollouts of agents with tools')}"
                    " made no tool call")
            if calls == 0 and self.tool_steps_checked == 1:
                warnings.append(f"step {step}: TOOLS NEVER CALLED: agents with tools made no tool call in any "
                                f"episode; likely {cause}")
        warnings += self._check_malformed(step, metrics, stops)
        every = metrics.get(f"{PREFIX}split_every_call_share")
        if every is not None and every > 0.5 and not self.warned_split_every_call:
            self.warned_split_every_call = True
            warnings.append(f"step {step}: {every:.0%} of the rollouts with several calls had their history "
                            "rewritten at every call (each call its own sample): a conversation manager trimming "
                            "every turn, or a client that re-renders messages differently each time")
        return warnings

    def _check_malformed(self, step: int, metrics: dict[str, Any], stops: list[str]) -> list[str]:
        """Add a stop when at least the share of the calls were malformed in enough steps in a row; warn at the first.

        A step counts only with ``min_tool_calls_for_malformed_stop`` calls or more: the share of a handful
        says little (a random policy that samples the tool-call token by chance writes a few malformed calls).
        """
        s, share = self.settings, metrics.get(f"{PREFIX}malformed_tool_call_share")
        if s.max_malformed_tool_call_share is None:
            return []
        over = share is not None and share >= s.max_malformed_tool_call_share
        calls, malformed = metrics.get(f"{PREFIX}tool_calls"), metrics.get(f"{PREFIX}malformed_tool_calls")
        if not over:
            self._malformed = []
            return []
        seen = f"{malformed:.0f} of {calls:.0f}" if calls is not None and malformed is not None else f"{share:.0%}"
        enough = calls is None or calls >= s.min_tool_calls_for_malformed_stop
        self._malformed = [*self._malformed, (step, seen)] if enough else []
        cause = "the tool parser (actor_rollout_ref.rollout.multi_turn.format) does not read the model's calls"
        settings = (f"rllm.guards.max_malformed_tool_call_share={s.max_malformed_tool_call_share}, "
                    f"max_steps_with_malformed_tool_calls={s.max_steps_with_malformed_tool_calls}, "
                    f"min_tool_calls_for_malformed_stop={s.min_tool_calls_for_malformed_stop}")
        if self.steps_with_malformed_tool_calls >= s.max_steps_with_malformed_tool_calls:
            stops.append(
                f"step {step}: {share:.0%} of the tool calls were malformed, the share over the limit in "
                f"{self.steps_with_malformed_tool_calls} step(s) in a row ({settings}): {cause}; "
                f"{_evidence(self._malformed, 'tool calls malformed')}")
            return []
        if self.warned_malformed:
            return []
        self.warned_malformed = True
        counted = "" if enough else (f"; a step with fewer than {s.min_tool_calls_for_malformed_stop} calls does not "
                                     "count toward the stop")
        return [f"step {step}: MALFORMED TOOL CALLS: {seen} tool calls malformed; likely {cause}, or a policy that "
                f"writes the tool-call token by chance (a random or barely trained model); the run stops after "
                f"{s.max_steps_with_malformed_tool_calls} such step(s) in a row ({settings}){counted}"]

    def check_run_end(self, step: int) -> None:
        """Raise at the end of a run in which no step had a group whose rewards varied, or no step was checked.

        A run that checked no step (resumed from a checkpoint at its last step, so verl ran none) never
        passes: it trained nothing and nothing showed it could.
        """
        if self.settings.max_steps_without_signal is None or self.steps_with_signal:
            return
        if not self.steps_checked:
            raise TrainingGuardError(
                f"no training step ran: the run ended at step {step} with no step checked, so it trained nothing and "
                "nothing showed a learning signal; a resumed run (trainer.resume_mode) whose checkpoint is already at "
                "trainer.total_training_steps has nothing left to do: start a new run (another "
                "trainer.default_local_dir, or trainer.resume_mode=disable) or raise trainer.total_training_steps "
                "(rllm.guards.max_steps_without_signal=null turns this off)", step=step)
        raise TrainingGuardError(
            f"no learning signal: in all {self.steps_checked} step(s) every rollout of every group got the same "
            "reward, so every advantage was zero and the weights never moved; check the reward function on this "
            "policy's answers, or raise actor_rollout_ref.rollout.n (rllm.guards.max_steps_without_signal=null "
            "turns this off)", step=step)


def summary_line(step: int, metrics: dict[str, Any]) -> str:
    """One line of the guard metrics of a step, for the console."""
    parts = []
    for name in ("logprob_gap_max", "groups_with_signal_share", "min_group_size", "truncated_share",
                 "context_overflow_share", "tool_calls_per_episode", "malformed_tool_call_share",
                 "zero_advantage_group_share"):
        value = metrics.get(PREFIX + name)
        if value is not None:
            parts.append(f"{name}={value:.3g}")
    if metrics.get("rllm/weights/fingerprint_match") is not None:
        parts.append(f"served_weights_match={metrics['rllm/weights/fingerprint_match']:.0f}")
    return f"step {step} guards: " + ", ".join(parts)
