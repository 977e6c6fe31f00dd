"""The training guards: each metric computed from a step's rollouts, and each stop firing when violated.

These check the guards' arithmetic and messages on rollouts written here; ``test_guard_faults_*.py``
shows each stop on verl's own trainer, with the fault injected into a real run.
"""

from __future__ import annotations

import math

import pytest

from rllm.errors import ConfigurationError, TrainingGuardError
from rllm.training.verl.trainer.guards import (
    PREFIX,
    GuardSettings,
    RolloutCounts,
    StepRollouts,
    TrainingGuards,
    group_violations,
    step_metrics,
    zero_advantage_share,
)

# Only the guard under test on: the others need metrics these hand-made steps do not all have.
ONLY = {"max_logprob_gap": None, "min_rollouts_per_group": None, "max_truncated_share": None,
        "max_steps_without_signal": None, "max_context_overflow_share": None, "max_steps_without_tool_calls": None,
        "max_malformed_tool_call_share": None}


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
    with pytest.raises(ConfigurationError, match=r"rllm\.guards\.max_gap"):
        GuardSettings.from_mapping({"max_gap": 1})


def test_a_group_is_its_rows_prompt_not_every_token_of_a_system_prompt_a_factory_varies() -> None:
    # A factory puts the date in its system prompt: the first prompts differ, the row (the task) is the same.
    varied = _rollouts([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"], prompts=[[1, 5], [1, 6], [2, 7], [2, 8]],
                       tasks=["row0", "row0", "row1", "row1"], rows=[0, 0, 1, 1], rollouts_per_prompt=2)
    assert group_violations(varied) == []
    assert _only().check_rollouts(1, step_metrics(varied), varied) == []
    # Two rows in one verl group still stop, whatever their prompts' tokens.
    two_rows = _rollouts([1.0, 0.0], ["a", "a"], prompts=[[1], [1]], tasks=["row0", "row1"], rows=[None, None])
    assert group_violations(two_rows) == ["group a holds rollouts of 2 different prompts (1 such group(s))"]
    with pytest.raises(TrainingGuardError, match="step 2: the RLOO groups are wrong"):
        _only().check_groups(2, two_rows)


def test_context_overflows_end_their_rollouts_and_stop_the_run_only_past_the_share() -> None:
    endings = ["context_overflow", "finished", "finished", "max_tokens"]
    metrics = _step([1.0, 0.0, 1.0, 0.0], endings=endings)
    assert metrics[PREFIX + "context_overflow_share"] == 0.25
    assert _only(max_context_overflow_share=0.5).check_rollouts(1, metrics) == []
    most = _step([1.0, 0.0, 1.0, 0.0], endings=["context_overflow"] * 3 + ["finished"])
    with pytest.raises(TrainingGuardError, match=r"step 2: 75% of the rollouts ended context_overflow.*"
                                                 r"max_context_overflow_share=0.5"):
        _only(max_context_overflow_share=0.5).check_rollouts(2, most)
    with pytest.raises(TrainingGuardError, match="max_context_overflow_share is on but the step has no"):
        _only(max_context_overflow_share=0.5).check_rollouts(3, _step([1.0, 0.0]))


def _tool_agents(calls: list[float], *, tools: int = 1, malformed: float = 0.0,
                 counts_malformed: list[float] | None = None, **counts: float) -> dict[str, float]:
    """A step of rollouts by agents with ``tools`` tools, each making ``calls[i]`` tool calls.

    Each rollout's malformed calls are ``malformed``, or ``counts_malformed[i]``.
    """
    each = counts_malformed or [malformed] * len(calls)
    return _step([1.0, 0.0] * (len(calls) // 2), tool_calls=calls,
                 counts=[RolloutCounts(tools=tools, malformed_tool_calls=m, **counts) for m in each])


def test_an_agent_with_tools_that_never_calls_one_is_a_warning_then_a_stop_naming_the_parser() -> None:
    guards = _only(max_steps_without_tool_calls=3)
    (warning,) = guards.check_rollouts(1, _tool_agents([0, 0]))
    assert "TOOLS NEVER CALLED" in warning and "multi_turn.format" in warning
    assert guards.check_rollouts(2, _tool_agents([0, 0])) == []
    with pytest.raises(TrainingGuardError, match=r"step 3: agents with tools called none in 3 step\(s\) in a row.*"
                                                 r"actor_rollout_ref.rollout.multi_turn.format.*chat template"):
        guards.check_rollouts(3, _tool_agents([0, 0]))
    # A step with calls resets the count; agents without tools are never held to it.
    guards = _only(max_steps_without_tool_calls=2)
    guards.check_rollouts(1, _tool_agents([0, 1]))
    guards.check_rollouts(2, _tool_agents([0, 0]))
    guards.check_rollouts(3, _tool_agents([1, 0]))
    guards = _only(max_steps_without_tool_calls=2)
    for step in range(1, 5):
        assert guards.check_rollouts(step, _tool_agents([0, 0], tools=0)) == []


def test_every_tool_call_malformed_stops_and_the_share_is_a_metric() -> None:
    # One step of evidence and three calls stop only when the recipe asks for that (the defaults need more).
    one_step = {"max_steps_with_malformed_tool_calls": 1, "min_tool_calls_for_malformed_stop": 1}
    half = _tool_agents([2, 2], malformed=1)
    assert half[PREFIX + "malformed_tool_call_share"] == 0.5
    assert _only(max_malformed_tool_call_share=1.0, **one_step).check_rollouts(1, half) == []
    with pytest.raises(TrainingGuardError, match=r"step 2: 100% of the tool calls were malformed.*multi_turn.format"):
        _only(max_malformed_tool_call_share=1.0, **one_step).check_rollouts(2, _tool_agents([2, 1], malformed=2))


def test_a_random_models_smoke_run_with_malformed_calls_at_step_1_warns_and_trains(
        caplog: pytest.LogCaptureFixture) -> None:
    # Two steps of two prompts of two rollouts (the --smoke overlay); the random model writes 7 tool calls at step 1,
    # every one malformed, and 2 readable ones at step 2: the tool guards at their defaults warn and let it train.
    guards = _only(max_malformed_tool_call_share=1.0, max_steps_without_tool_calls=3, max_steps_without_signal=3)
    step_1 = _tool_agents([3, 2, 1, 1], malformed=0, counts_malformed=[3, 2, 1, 1])
    assert (step_1[PREFIX + "tool_calls"], step_1[PREFIX + "malformed_tool_calls"]) == (7, 7)
    (warning,) = guards.check_rollouts(1, step_1)
    assert warning.startswith("step 1: MALFORMED TOOL CALLS: 7 of 7 tool calls malformed; likely the tool parser")
    assert "a step with fewer than 10 calls does not count toward the stop" in warning
    assert "MALFORMED TOOL CALLS" in caplog.text
    assert guards.check_rollouts(2, _tool_agents([1, 0, 1, 0])) == []
    guards.check_run_end(2)  # its groups had a learning signal: the run passes


def test_malformed_calls_stop_only_over_three_steps_in_a_row_each_with_enough_calls() -> None:
    guards = _only(max_malformed_tool_call_share=1.0)  # the defaults: 3 steps, 10 calls each
    (warning,) = guards.check_rollouts(1, _tool_agents([3, 3, 3, 3], counts_malformed=[3, 3, 3, 3]))
    assert "12 of 12 tool calls malformed" in warning and "does not count" not in warning
    assert guards.check_rollouts(2, _tool_agents([5, 5], counts_malformed=[5, 5])) == []  # warned once
    with pytest.raises(TrainingGuardError) as caught:
        guards.check_rollouts(3, _tool_agents([4, 4, 3, 3], counts_malformed=[4, 4, 3, 3]))
    assert str(caught.value) == (
        "step 3: 100% of the tool calls were malformed, the share over the limit in 3 step(s) in a row "
        "(rllm.guards.max_malformed_tool_call_share=1.0, max_steps_with_malformed_tool_calls=3, "
        "min_tool_calls_for_malformed_stop=10): the tool parser (actor_rollout_ref.rollout.multi_turn.format) does "
        "not read the model's calls; steps 1-3: 12 of 12, 10 of 10, 14 of 14 tool calls malformed")
    assert caught.value.step == 3


@pytest.mark.parametrize("between", [
    pytest.param(([3, 3], [3, 3]), id="a step with too few calls"),
    pytest.param(([5, 5], [5, 4]), id="a step under the share"),
    pytest.param(([0, 0], [0, 0]), id="a step without calls"),
])
def test_a_step_that_does_not_count_restarts_the_malformed_run(between: tuple[list[float], list[float]]) -> None:
    guards = _only(max_malformed_tool_call_share=1.0, max_steps_with_malformed_tool_calls=2)
    every = _tool_agents([5, 5], counts_malformed=[5, 5])
    calls, malformed = between
    guards.check_rollouts(1, every)
    guards.check_rollouts(2, _tool_agents(calls, counts_malformed=malformed))
    guards.check_rollouts(3, every)  # a run of one again
    with pytest.raises(TrainingGuardError, match=r"in 2 step\(s\) in a row .*; steps 3-4: 10 of 10, 10 of 10 tool"):
        guards.check_rollouts(4, every)


def test_the_run_of_steps_stops_name_their_steps_and_counts() -> None:
    guards = _only(max_steps_without_signal=3)
    for step in (4, 5):
        guards.check_rollouts(step, _step([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(TrainingGuardError) as caught:
        guards.check_rollouts(6, _step([1.0, 1.0, 0.0, 0.0, 1.0, 1.0]))
    assert str(caught.value).endswith("(rllm.guards.max_steps_without_signal=3); steps 4-6: 0 of 2, 0 of 2, 0 of 3 "
                                      "groups had rewards that varied")
    guards = _only(max_steps_without_tool_calls=2)
    guards.check_rollouts(1, _tool_agents([0, 0]))
    with pytest.raises(TrainingGuardError) as caught:
        guards.check_rollouts(2, _tool_agents([0, 0, 0, 0]))
    assert str(caught.value).endswith("not from using its tools; steps 1-2: 2, 4 rollouts of agents with tools made "
                                      "no tool call")


def test_a_run_that_checked_no_step_fails_unless_the_signal_guard_is_off() -> None:
    # A resumed run whose checkpoint is at its last step: verl runs no step, and the run must not pass silently.
    with pytest.raises(TrainingGuardError, match=r"^no training step ran: the run ended at step 2 with no step "
                                                 r"checked.*trainer.resume_mode") as caught:
        _only(max_steps_without_signal=3).check_run_end(2)
    assert caught.value.step == 2
    _only().check_run_end(2)  # rllm.guards.max_steps_without_signal=null: the check is off
    guards = _only(max_steps_without_signal=3)
    guards.check_rollouts(1, _step([1.0, 0.0]))
    guards.check_run_end(1)  # a step with a signal: the run passes


def test_side_calls_discarded_answers_and_rewritten_histories_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = _tool_agents([1, 1], model_calls=4, rewritten_calls=1, side_calls=2, discarded_answers=1)
    assert metrics[PREFIX + "side_calls"] == 4 and metrics[PREFIX + "discarded_answers"] == 2
    assert metrics[PREFIX + "rewritten_call_share"] == 0.25 and metrics[PREFIX + "split_every_call_share"] == 0
    guards = _only()
    assert guards.check_rollouts(1, metrics) == []
    every = _tool_agents([1, 1], model_calls=4, rewritten_calls=3)
    assert every[PREFIX + "rewritten_call_share"] == 0.75 and every[PREFIX + "split_every_call_share"] == 1
    (warning,) = guards.check_rollouts(2, every)
    assert "rewritten at every call" in warning and "rewritten at every call" in caplog.text
    assert guards.check_rollouts(3, every) == []  # once per run


def test_the_new_guard_keys_are_read_from_the_recipe() -> None:
    settings = GuardSettings.from_mapping({"max_context_overflow_share": None, "max_steps_without_tool_calls": 5,
                                           "max_malformed_tool_call_share": 0.9})
    assert (settings.max_context_overflow_share, settings.max_steps_without_tool_calls,
            settings.max_malformed_tool_call_share) == (None, 5, 0.9)
    assert GuardSettings() == GuardSettings(max_context_overflow_share=0.5, max_steps_without_tool_calls=3,
                                            max_malformed_tool_call_share=1.0)


def test_the_malformed_stops_evidence_keys_are_read_from_the_recipe() -> None:
    settings = GuardSettings.from_mapping({"max_steps_with_malformed_tool_calls": 5,
                                           "min_tool_calls_for_malformed_stop": 40})
    assert (settings.max_steps_with_malformed_tool_calls, settings.min_tool_calls_for_malformed_stop) == (5, 40)
    assert (GuardSettings().max_steps_with_malformed_tool_calls, GuardSettings().min_tool_calls_for_malformed_stop) \
        == (3, 10)
    with pytest.raises(ConfigurationError, match=r"rllm.guards.max_steps_with_malformed_tool_calls=0: expected a "
                                                 r"whole number of at least 1"):
        GuardSettings.from_mapping({"max_steps_with_malformed_tool_calls": 0})


def test_every_stop_that_holds_at_a_step_is_named_in_the_one_stop(caplog: pytest.LogCaptureFixture) -> None:
    # A step whose responses were all cut and whose rewards never varied: one stop names both, the first as
    # the message begins, the other after "also", and the step's warnings are logged before it.
    guards = _only(max_truncated_share=0.5, max_steps_without_signal=1)
    with pytest.raises(TrainingGuardError) as stopped:
        guards.check_rollouts(1, _step([0.0, 0.0, 0.0, 0.0], truncated=[True, True, True, True]))
    first, also = str(stopped.value).split("\n")
    assert first.startswith("step 1: 100% of the responses were cut at response_length")
    assert also.startswith("also step 1: the reward was the same for every rollout of every group for 1 step(s)")
    assert stopped.value.step == 1
    assert "every group's rollouts got the same reward" in caplog.text  # the first step's warning, logged
    # One reason alone reads as before: the message is that reason.
    with pytest.raises(TrainingGuardError, match=r"^step 1: 75% of the responses were cut[^\n]*$"):
        _only(max_truncated_share=0.5).check_rollouts(
            1, _step([1.0, 0.0, 1.0, 0.0], truncated=[True, True, True, False]))


def test_a_stop_on_the_groups_names_the_steps_other_stops_except_the_log_prob_gap() -> None:
    # The runner checks the groups before the actor's log-prob pass (a group of one would not split into its
    # micro-batches): that stop names the other stops the step's rollouts give, but not the gap guard, which
    # has nothing to read yet (on, it would otherwise stop the step for a missing metric).
    guards = _only(min_rollouts_per_group=2, max_truncated_share=0.25, max_logprob_gap=0.1)
    rollouts = _rollouts([1.0, 0.0, 1.0], groups=["a", "a", "b"], truncated=[True, True, False])
    with pytest.raises(TrainingGuardError) as stopped:
        guards.check_groups(2, rollouts)
    error = guards.with_other_stops(stopped.value, step_metrics(rollouts))
    first, also = str(error).split("\n")
    assert first == str(stopped.value) and first.startswith("step 2: a group has 1 rollout(s)")
    assert also.startswith("also step 2: 67% of the responses were cut at response_length")
    assert error.step == 2
    # Nothing else holding: the groups' stop alone, unchanged.
    alone = _rollouts([1.0, 0.0, 1.0], groups=["a", "a", "b"], truncated=[False, False, False])
    assert str(guards.with_other_stops(stopped.value, step_metrics(alone))) == str(stopped.value)
