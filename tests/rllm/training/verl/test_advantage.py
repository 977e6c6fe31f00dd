"""RLOO per rollout: a rollout that verl stores as several samples counts once, and weighs what it would unsplit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed: the train extra")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_rloo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from rllm.errors import ConfigurationError  # noqa: E402
from rllm.training.verl.trainer.advantage import (  # noqa: E402
    check_split_rollouts,
    role_advantages,
    rollout_advantages,
    split_rollouts,
)


def test_an_unsplit_batch_gets_exactly_verls_rloo() -> None:
    keys = ["a_0_0", "a_1_0", "a_2_0", "b_0_0", "b_1_0"]
    uids = ["a", "a", "a", "b", "b"]
    scores = [1.0, 0.0, 0.5, 1.0, 1.0]
    rewards = torch.tensor([[s] for s in scores])
    expected, _ = compute_rloo_outcome_advantage(rewards, torch.ones_like(rewards), np.array(uids, dtype=object))

    assert rollout_advantages(keys, uids, scores) == pytest.approx(expected[:, 0].tolist())
    assert split_rollouts(keys) == 0


def test_a_rollout_split_into_three_samples_counts_once_in_its_groups_baseline() -> None:
    # Rollout 0 of prompt "a" came back as three samples (its reward on each); rollouts 1 and 2 are one row each.
    keys = ["a_0_0", "a_0_1", "a_0_2", "a_1_0", "a_2_0"]
    uids = ["a"] * 5
    scores = [1.0, 1.0, 1.0, 0.0, 0.5]

    advantages = rollout_advantages(keys, uids, scores)

    # Leave-one-out over three rollouts: 1 - mean(0, 0.5), 0 - mean(1, 0.5), 0.5 - mean(1, 0).
    assert advantages == pytest.approx([0.75, 0.75, 0.75, -0.75, 0.0])
    assert split_rollouts(keys) == 1


def test_verls_multi_trajectory_advantage_runs_rloo_over_rows_which_is_why_rllm_recomputes_it() -> None:
    # Pins verl 0.9.1: per-rollout advantages for GRPO only; RLOO counts the three samples as three rollouts.
    keys = ["a_0_0", "a_0_1", "a_0_2", "a_1_0", "a_2_0"]
    scores = [1.0, 1.0, 1.0, 0.0, 0.5]
    rewards = torch.zeros(5, 4)
    rewards[:, -1] = torch.tensor(scores)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": torch.ones(5, 4)},
                               non_tensors={"uid": np.array(["a"] * 5, dtype=object)})

    rows = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="rloo")

    per_row = rows.batch["advantages"][:, 0].tolist()
    assert per_row == pytest.approx([(s - 0.7) * 5 / 4 for s in scores])  # five "rollouts", mean 0.7
    assert per_row != pytest.approx(rollout_advantages(keys, ["a"] * 5, scores))


def test_under_token_mean_a_split_rollout_weighs_what_the_same_rollout_unsplit_weighs() -> None:
    # The same ten sampled tokens, in one row or in samples of 3, 3 and 4: the same advantage on each token.
    unsplit = rollout_advantages(["a_0_0", "a_1_0"], ["a", "a"], [1.0, 0.0])
    split = rollout_advantages(["a_0_0", "a_0_1", "a_0_2", "a_1_0"], ["a"] * 4, [1.0, 1.0, 1.0, 0.0])
    tokens_unsplit = [10, 10]
    tokens_split = [3, 3, 4, 10]

    weight_unsplit = unsplit[0] * tokens_unsplit[0]
    weight_split = sum(a * n for a, n in zip(split[:3], tokens_split[:3], strict=True))
    assert weight_split == pytest.approx(weight_unsplit)
    assert split[3] == pytest.approx(unsplit[1])


@pytest.mark.parametrize(("estimator", "loss", "kl", "named"), [
    ("gae", "token-mean", False, "algorithm.adv_estimator=gae"),
    ("rloo", "seq-mean-token-mean", False, "loss_agg_mode=seq-mean-token-mean"),
    ("rloo", "token-mean", True, "use_kl_in_reward=true"),
])
def test_a_configuration_that_would_count_a_split_rollout_more_than_once_is_refused(estimator, loss, kl, named) -> None:
    with pytest.raises(ConfigurationError, match=named):
        check_split_rollouts(4, 2, estimator=estimator, loss_agg_mode=loss, kl_in_reward=kl)
    check_split_rollouts(4, 0, estimator=estimator, loss_agg_mode=loss, kl_in_reward=kl)  # nothing split: fine
    check_split_rollouts(4, 2, estimator="grpo", loss_agg_mode="token-mean", kl_in_reward=False)


def test_a_key_that_is_not_verls_row_key_is_refused() -> None:
    with pytest.raises(ValueError, match="not a verl v1 row key"):
        split_rollouts(["no-index"])


def test_per_role_rloo_equals_per_episode_when_every_node_runs_and_loses_its_baseline_when_one_does_not() -> None:
    # Two prompts x three team runs; each run a researcher row and a writer row, one reward per run.
    keys = [f"{uid}_{run}_{index}" for uid in ("a", "b") for run in range(3) for index in range(2)]
    uids = [key[0] for key in keys]
    roles = ["researcher", "writer"] * 6
    scores = [s for s in (1.0, 0.0, 0.0, 1.0, 1.0, 0.0) for _ in range(2)]
    assert role_advantages(keys, uids, roles, scores) == pytest.approx(rollout_advantages(keys, uids, scores))
    # The writer ran in one of prompt a's runs only (a conditional edge, a Swarm that did not hand off):
    # per role, that run's writer is a group of one, trained on its raw reward; per episode it keeps its baseline.
    kept = [i for i, key in enumerate(keys) if not (key.startswith("a_") and roles[i] == "writer" and key[2] != "1")]
    keys, uids, roles, scores = ([v[i] for i in kept] for v in (keys, uids, roles, scores))
    by_role = dict(zip(zip(keys, roles), role_advantages(keys, uids, roles, scores)))
    by_episode = dict(zip(zip(keys, roles), rollout_advantages(keys, uids, scores)))
    assert by_role[("a_1_1", "writer")] == 0.0  # its reward, 0, with nothing to compare it with: no signal
    assert by_episode[("a_1_1", "writer")] == pytest.approx(-0.5)  # the run's advantage, as its researcher's
    assert by_role[("a_1_0", "researcher")] == by_episode[("a_1_0", "researcher")] == pytest.approx(-0.5)
