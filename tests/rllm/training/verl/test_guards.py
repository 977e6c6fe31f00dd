"""The training guards: each metric computed from a step's rollouts, and each stop firing when violated.

These check the guards' arithmetic and messages on rollouts written here; ``test_guard_faults_*.py``
shows each stop on verl's own trainer, with the fault injected into a real run.
"""

from __future__ import annotations

import math

import pytest

from rllm.errors import TrainingGuardError
from rllm.training.verl.guards import (
    PREFIX,
    GuardSettings,
    StepRollouts,
    TrainingGuards,
    group_violations,
    step_metrics,
    zero_advantage_share,
)

# Only the guard under test on: the others need metrics these hand-made steps do not all have.
ONLY = {"max_logprob_gap": None, "min_rollouts_per_group": None, "max_truncated_share": None,
        "max_steps_without_signal": None}


def _only(**settings: object) -> TrainingGuards:
    return TrainingGuards(GuardSettings(**{**ONLY, **settings}))  # type: ignore[arg-type]


def _rollouts(rewards: list[float], groups: list[str] | None = None, **fields: object) -> StepRollouts:
    groups = groups or [f"u{i // 2}" for i in range(len(rewards))]
    return StepRollouts(groups=groups, rewards=rewards, **fields)  # type: ignore[arg-type]


def _step(rewards: list[float], groups: list[str] | None = None, **fields: object) -> dict[str, float]:
    return step_metrics(_rollouts(rewards, groups, **fields))


def test_metrics_of_a_step() -> None:
    metrics = _step([1.0, 0.0, 0.0, 0.0], rollout_logprobs=[[-1.0, -2.0], [-0.5]], actor_logprobs=[[-1.0, -2.5], [-0.5]],
                    truncated=[False, True, False, False], tool_calls=[1, 2, None, 0])
    assert metrics[PREFIX + "groups"] == 2 and metrics[PREFIX + "min_group_size"] == 2
    assert metrics[PREFIX + "groups_with_signal_share"] == 0.5  # group u0 varies, u1 does not
    assert metrics[PREFIX + "logprob_gap_max"] == 0.5 and math.isclose(metrics[PREFIX + "logprob_gap_mean"], 0.5 / 3)
    assert metrics[PREFIX + "logprob_gap_rollouts"] == 2
    assert metrics[PREFIX + "truncated_share"] == 0.25
    assert metrics[PREFIX + "tool_calls_per_episode"] == 1.0  # the rollout that did not report is left out
    assert metrics[PREFIX + "group_violations"] == 0


def test_stale_served_weights_stop_the_run() -> None:
    guards = _only(max_logprob_gap=0.1)
    fresh = _step([1.0, 0.0], rollout_logprobs=[[-1.0, -2.0]], actor_logprobs=[[-1.0001, -2.0]])
    assert guards.check(1, {**fresh, "actor/loss": 0.1}) == []
    stale = _step([1.0, 0.0], rollout_logprobs=[[-1.0, -2.0]], actor_logprobs=[[-1.4, -2.5]])
    with pytest.raises(TrainingGuardError, match="step 2: .*served weights are not the ones being trained") as caught:
        guards.check(2, {**stale, "actor/loss": 0.1})
    assert caught.value.step == 2


def test_a_guard_that_is_on_but_cannot_read_its_metric_stops_the_step() -> None:
    # No log-probs compared (nothing audited) and no truncation reported: off is a setting, never an accident.
    with pytest.raises(TrainingGuardError, match=r"step 4: the guard rllm.guards.max_logprob_gap is on but the step "
                                                 r"has no rllm/guard/logprob_gap_mean"):
        _only(max_logprob_gap=0.1).check_rollouts(4, _step([1.0, 0.0]))
    with pytest.raises(TrainingGuardError, match="max_truncated_share is on but the step has no"):
        _only(max_truncated_share=0.5).check_rollouts(4, _step([1.0, 0.0], truncated=[None, None]))
    with pytest.raises(TrainingGuardError, match="verl logged no loss for the update"):
        _only().check_update(4, {"actor/grad_norm": 0.3})


def test_a_group_of_one_stops_the_run() -> None:
    with pytest.raises(TrainingGuardError, match="a group has 1 rollout.*rollout.n"):
        _only(min_rollouts_per_group=2).check_rollouts(3, _step([1.0, 0.0], groups=["a", "b"]))
    # Read from the rollouts alone, before the trainer has any metric (the runner checks groups first).
    with pytest.raises(TrainingGuardError, match="step 4: a group has 1 rollout"):
        _only(min_rollouts_per_group=2).check_groups(4, _rollouts([1.0, 0.0, 1.0], groups=["a", "a", "b"]))
    _only(min_rollouts_per_group=2).check_groups(4, _rollouts([1.0, 0.0], groups=["a", "a"]))


def test_groups_that_are_not_their_prompts_stop_the_run() -> None:
    ok = _rollouts([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], prompts=[[1, 2], [1, 2], [3], [3]], rows=[0, 0, 1, 1],
                   rollouts_per_prompt=2)
    assert group_violations(ok) == []
    mixed = _rollouts([1.0, 0.0], ["a", "a"], prompts=[[1, 2], [1, 3]], rows=[0, 0])
    split = _rollouts([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"], prompts=[[1], [1], [1], [1]], rows=[7, 7, 7, 7])
    merged = _rollouts([1.0, 0.0, 1.0], ["a", "a", "a"], prompts=[[1], [1], [1]], rows=[0, 0, 0], rollouts_per_prompt=2)
    assert group_violations(mixed) == ["group a holds rollouts of 2 different prompts (1 such group(s))"]
    assert group_violations(split) == ["the rollouts of dataset row 7 are split across 2 groups (1 such row(s))"]
    assert group_violations(merged) == ["group a has 3 rollouts, more than rollout.n=2"]
    for wrong in (mixed, split, merged):
        assert step_metrics(wrong)[PREFIX + "group_violations"] == 1
        with pytest.raises(TrainingGuardError, match="step 5: the RLOO groups are wrong"):
            _only().check_rollouts(5, step_metrics(wrong), wrong)
    assert _only().check_rollouts(5, step_metrics(ok), ok) == []


def test_rows_without_a_dataset_index_are_not_taken_for_a_split_prompt() -> None:
    rollouts = _rollouts([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"], prompts=[[1], [1], [2], [2]], rows=[None] * 4)
    assert group_violations(rollouts) == []


def test_the_share_of_groups_without_any_advantage() -> None:
    groups = ["a", "a", "b", "b", "c", "c"]
    advantages = [[0.5, 0.5], [-0.5], [0.0, 0.0], [0.0], [0.0], [0.1]]
    assert zero_advantage_share(groups, advantages) == pytest.approx(1 / 3)  # only b has no gradient


def test_a_constant_reward_stops_after_the_allowed_steps_without_signal() -> None:
    guards = _only(max_steps_without_signal=2)
    guards.check_rollouts(1, _step([0.0, 0.0, 0.0, 0.0]))
    guards.check_rollouts(2, _step([1.0, 0.0, 1.0, 1.0]))  # a signal resets the count
    guards.check_rollouts(3, _step([1.0, 1.0, 0.0, 0.0]))
    with pytest.raises(TrainingGuardError, match="step 4: the reward was the same .* 2 step"):
        guards.check_rollouts(4, _step([0.0, 0.0, 0.0, 0.0]))


def test_too_many_truncated_responses_stop_the_run() -> None:
    with pytest.raises(TrainingGuardError, match="75% of the responses were cut"):
        _only(max_truncated_share=0.5).check_rollouts(
            1, _step([1.0, 0.0, 1.0, 0.0], truncated=[True, True, True, False]))


def test_tool_use_falling_to_zero_is_a_warning_not_a_stop(caplog: pytest.LogCaptureFixture) -> None:
    guards = _only()
    assert guards.check_rollouts(1, _step([1.0, 0.0], tool_calls=[0, 0])) == []  # never used: nothing to say
    assert guards.check_rollouts(2, _step([1.0, 0.0], tool_calls=[1, 2])) == []
    assert guards.check_rollouts(3, _step([1.0, 0.0], tool_calls=[0, 0])) == [
        "step 3: tool calls per episode fell to zero (they were above zero before)"]
    assert "tool calls per episode fell to zero" in caplog.text


@pytest.mark.parametrize("name", ["actor/loss", "actor/pg_loss", "actor/entropy_loss", "actor/kl_loss",
                                  "actor/entropy"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_loss_stops_with_its_step(name: str, value: float) -> None:
    with pytest.raises(TrainingGuardError, match=f"step 7: {name} is {value}"):
        _only().check_update(7, {"actor/pg_loss": 0.1, name: value})


def test_a_nan_gradient_norm_stops_and_an_infinite_one_alone_does_not() -> None:
    """fp16 on a GPU: the grad scaler's early overflow gives an infinite norm for an update it then skips."""
    _only().check_update(1, {"actor/grad_norm": math.inf, "actor/pg_loss": 0.1})
    with pytest.raises(TrainingGuardError, match="step 2: actor/grad_norm is nan"):
        _only().check_update(2, {"actor/grad_norm": math.nan, "actor/pg_loss": 0.1})


def test_guards_can_be_turned_off_and_unknown_settings_are_refused() -> None:
    TrainingGuards(GuardSettings.from_mapping(ONLY)).check(
        1, {**_step([0.0], groups=["a"], truncated=[True], rollout_logprobs=[[0.0]], actor_logprobs=[[-9.0]]),
            "actor/loss": 0.0})
    with pytest.raises(ValueError, match=r"rllm\.guards\.max_gap"):
        GuardSettings.from_mapping({"max_gap": 1})
