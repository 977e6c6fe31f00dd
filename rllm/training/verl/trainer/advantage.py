"""RLOO over rollouts, not rows: a rollout stored as several samples counts once in its group.

A rollout whose history a conversation manager rewrote is several samples
(``TokenSession.samples``), which the pinned verl's v1 trainer stores as rows ``{uid}_{session_id}_{index}``,
every row carrying the rollout's reward. verl computes the advantage per rollout (the last sample's,
broadcast to the others) for GRPO only (``compute_advantage_for_multi_trajectories``); RLOO runs over
rows, so a rollout split into three samples would be three members of its group's leave-one-out
baseline and pull it three times. ``rollout_advantages`` computes RLOO as verl's own estimator
(``compute_rloo_outcome_advantage``) over one row per rollout and gives each sample its rollout's
advantage.

The loss then weighs a rollout as it weighs an unsplit one only when it sums over tokens: each
sampled token is in exactly one sample, so under ``token-mean`` a split rollout holds the same
tokens with the same advantage. The ``seq-mean-*`` modes weigh every row alike, a split rollout k
times, and are refused (``check_split_rollouts``), as are the estimators verl runs over rows and a KL
penalty in the reward (which is per token, hence per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllm.errors import ConfigurationError
from rllm.training.verl.verl_internals import TQ_ROW_KEY

SPLIT_ESTIMATORS = ("rloo", "grpo")
"""Estimators that count a split rollout once: GRPO by verl itself, RLOO by ``rollout_advantages``."""
TOKEN_WEIGHTED_LOSS = ("token-mean",)
"""``actor.loss_agg_mode`` values under which a split rollout weighs what it would unsplit."""


def rollout_of(key: str) -> tuple[str, int]:
    """``({uid}_{session_id}, index)`` of a v1 row key ``TQ_ROW_KEY`` (``{uid}_{session_id}_{index}``)."""
    rollout, _, index = key.rpartition("_")
    if not rollout or not index.isdigit():
        raise ValueError(f"{key!r} is not a verl v1 row key {TQ_ROW_KEY}")
    return rollout, int(index)


def split_rollouts(keys: Sequence[str]) -> int:
    """How many rollouts of the batch are more than one row."""
    rows: dict[str, int] = {}
    for key in keys:
        rollout, _ = rollout_of(key)
        rows[rollout] = rows.get(rollout, 0) + 1
    return sum(1 for count in rows.values() if count > 1)


def check_split_rollouts(step: int, split: int, *, estimator: str, loss_agg_mode: str, kl_in_reward: bool) -> None:
    """Refuse a step with split rollouts that the configuration would count more than once (``ConfigurationError``)."""
    if not split:
        return
    where = f"step {step}: {split} rollout(s) came back as several samples (a rewritten history)"
    if estimator not in SPLIT_ESTIMATORS:
        raise ConfigurationError(f"{where}, and algorithm.adv_estimator={estimator} counts each sample as a rollout; "
                                 f"use one of {', '.join(SPLIT_ESTIMATORS)}, or keep the agent's history append-only")
    if loss_agg_mode not in TOKEN_WEIGHTED_LOSS:
        raise ConfigurationError(f"{where}, and actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode} weighs every "
                                 "sample as a whole rollout; use token-mean, under which a split rollout weighs what "
                                 "it would unsplit")
    if kl_in_reward:
        raise ConfigurationError(f"{where}, and algorithm.use_kl_in_reward=true makes each sample's reward its own; "
                                 "use the KL loss (actor_rollout_ref.actor.use_kl_loss) instead")


def rollout_advantages(keys: Sequence[str], uids: Sequence[Any], scores: Sequence[float]) -> list[float]:
    """Each row's RLOO advantage, computed over one row per rollout (its last sample) and shared by its samples.

    ``scores`` is each row's reward (every sample of a rollout carries the rollout's). The numbers are
    verl's own ``compute_rloo_outcome_advantage`` on those rows, so an unsplit batch gets exactly
    what verl gives it.
    """
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_rloo_outcome_advantage

    last: dict[str, tuple[int, int]] = {}
    for row, key in enumerate(keys):
        rollout, index = rollout_of(key)
        if rollout not in last or last[rollout][0] < index:
            last[rollout] = (index, row)
    rows = [row for _, row in last.values()]
    rewards = torch.tensor([[float(scores[row])] for row in rows], dtype=torch.float32)
    advantages, _ = compute_rloo_outcome_advantage(rewards, torch.ones_like(rewards),
                                                   np.array([uids[row] for row in rows], dtype=object))
    per_rollout = {rollout: float(advantages[i, 0]) for i, rollout in enumerate(last)}
    return [per_rollout[rollout_of(key)[0]] for key in keys]


def role_advantages(keys: Sequence[str], uids: Sequence[Any], roles: Sequence[str],
                    scores: Sequence[float]) -> list[float]:
    """The alternative not chosen: RLOO per role, each (prompt, node) its own group over the rollouts where it ran.

    Each row's advantage is its (rollout, role)'s; verl's ``compute_rloo_outcome_advantage`` over one entry
    per (rollout, role), grouped by (uid, role). With every node in every rollout this equals
    ``rollout_advantages``; where a node runs in some rollouts only (a Swarm's hand-offs, a conditional
    edge), its group shrinks, down to one rollout without a baseline. ``scripts/measure_team_credit.py``
    measures both on a team's real rollouts; ARCHITECTURE.md, "Teams", says why rllm trains per episode.
    """
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_rloo_outcome_advantage

    entries: dict[tuple[str, str], int] = {}
    for row, (key, role) in enumerate(zip(keys, roles, strict=True)):
        entries.setdefault((rollout_of(key)[0], role), row)
    rewards = torch.tensor([[float(scores[row])] for row in entries.values()], dtype=torch.float32)
    groups = np.array([f"{uids[row]}|{role}" for (_, role), row in entries.items()], dtype=object)
    advantages, _ = compute_rloo_outcome_advantage(rewards, torch.ones_like(rewards), groups)
    per_entry = {entry: float(advantages[i, 0]) for i, entry in enumerate(entries)}
    return [per_entry[(rollout_of(key)[0], role)] for key, role in zip(keys, roles, strict=True)]
