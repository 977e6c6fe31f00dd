"""The training guards: each metric computed from a step's rollouts, and each stop firing when violated."""

from __future__ import annotations

import math

import pytest

from rllm.errors import TrainingGuardError
from rllm.training.verl.guards import PREFIX, GuardSettings, StepRollouts, TrainingGuards, step_metrics


def _step(rewards: list[float], groups: list[str] | None = None, **fields: object) -> dict[str, float]:
    groups = groups or [f"u{i // 2}" for i in range(len(rewards))]
    return step_metrics(StepRollouts(groups=groups, rewards=rewards, **fields))  # type: ignore[arg-type]


def test_metrics_of_a_step() -> None:
    metrics = _step([1.0, 0.0, 0.0, 0.0], rollout_logprobs=[[-1.0, -2.0], [-0.5]], actor_logprobs=[[-1.0, -2.5], [-0.5]],
                    truncated=[False, True, False, False], tool_calls=[1, 2, None, 0])
    assert metrics[PREFIX + "groups"] == 2 and metrics[PREFIX + "min_group_size"] == 2
    assert metrics[PREFIX + "groups_with_signal_share"] == 0.5  # group u0 varies, u1 does not
    assert metrics[PREFIX + "logprob_gap_max"] == 0.5 and math.isclose(metrics[PREFIX + "logprob_gap_mean"], 0.5 / 3)
    assert metrics[PREFIX + "truncated_share"] == 0.25
    assert metrics[PREFIX + "tool_calls_per_episode"] == 1.0  # the rollout that did not report is left out


def test_stale_served_weights_stop_the_run() -> None:
    guards = TrainingGuards(GuardSettings(max_logprob_gap=0.1))
    fresh = _step([1.0, 0.0], rollout_logprobs=[[-1.0, -2.0]], actor_logprobs=[[-1.0001, -2.0]])
    assert guards.check(1, fresh) == []
    stale = _step([1.0, 0.0], rollout_logprobs=[[-1.0, -2.0]], actor_logprobs=[[-1.4, -2.5]])
    with pytest.raises(TrainingGuardError, match="step 2: .*served weights are not the ones being trained") as caught:
        guards.check(2, stale)
    assert caught.value.step == 2


def test_a_group_of_one_stops_the_run() -> None:
    with pytest.raises(TrainingGuardError, match="a group has 1 rollout.*rollout.n"):
        TrainingGuards(GuardSettings()).check(3, _step([1.0, 0.0], groups=["a", "b"]))


def test_a_constant_reward_stops_after_the_allowed_steps_without_signal() -> None:
    guards = TrainingGuards(GuardSettings(max_steps_without_signal=2))
    guards.check(1, _step([0.0, 0.0, 0.0, 0.0]))
    guards.check(2, _step([1.0, 0.0, 1.0, 1.0]))  # a signal resets the count
    guards.check(3, _step([1.0, 1.0, 0.0, 0.0]))
    with pytest.raises(TrainingGuardError, match="step 4: the reward was the same .* 2 step"):
        guards.check(4, _step([0.0, 0.0, 0.0, 0.0]))


def test_too_many_truncated_responses_stop_the_run() -> None:
    with pytest.raises(TrainingGuardError, match="75% of the responses were cut"):
        TrainingGuards(GuardSettings(max_truncated_share=0.5)).check(
            1, _step([1.0, 0.0, 1.0, 0.0], truncated=[True, True, True, False]))


def test_tool_use_falling_to_zero_is_a_warning_not_a_stop(caplog: pytest.LogCaptureFixture) -> None:
    guards = TrainingGuards(GuardSettings())
    assert guards.check(1, _step([1.0, 0.0], tool_calls=[0, 0])) == []  # never used: nothing to say
    assert guards.check(2, _step([1.0, 0.0], tool_calls=[1, 2])) == []
    assert guards.check(3, _step([1.0, 0.0], tool_calls=[0, 0])) == [
        "step 3: tool calls per episode fell to zero (they were above zero before)"]
    assert "tool calls per episode fell to zero" in caplog.text


@pytest.mark.parametrize("name", ["actor/loss", "actor/pg_loss", "actor/entropy_loss", "actor/kl_loss",
                                  "actor/entropy"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_loss_stops_with_its_step(name: str, value: float) -> None:
    with pytest.raises(TrainingGuardError, match=f"step 7: {name} is {value}"):
        TrainingGuards(GuardSettings()).check(7, {name: value})


def test_guards_can_be_turned_off_and_unknown_settings_are_refused() -> None:
    off = GuardSettings.from_mapping({"max_logprob_gap": None, "min_rollouts_per_group": None,
                                      "max_truncated_share": None, "max_steps_without_signal": None})
    TrainingGuards(off).check(1, _step([0.0], groups=["a"], truncated=[True], rollout_logprobs=[[0.0]],
                                       actor_logprobs=[[-9.0]]))
    with pytest.raises(ValueError, match=r"rllm\.guards\.max_gap"):
        GuardSettings.from_mapping({"max_gap": 1})


def test_an_infinite_gradient_norm_alone_is_not_a_stop() -> None:
    """fp16 on a GPU: the grad scaler's early overflow gives an infinite norm for an update it then skips."""
    TrainingGuards(GuardSettings()).check_update(1, {"actor/grad_norm": math.inf, "actor/pg_loss": 0.1})
