"""A supervised warm start on demonstrations: next-token loss on the tokens a teacher's rollouts sampled.

The demonstrations are ``Rollout``s from ``run_rollouts`` with a teacher engine
(``MessageScriptedEngine``), so their tokens come from the same runner and incremental renderer
as the policy's own rollouts; the loss is verl's SFT loss on their sampled tokens
(``LocalRLOOTrainer.supervised_step``).
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Sequence
from typing import Any

from rllm.training.local.batch import pad_rollouts
from rllm.training.local.rloo import LocalRLOOTrainer, default_actor_config
from rllm.training.local.rollouts import Rollout

logger = logging.getLogger(__name__)


def warm_start(model: Any, demonstrations: Sequence[Rollout], *, pad_token_id: int, steps: int, batch_size: int,
               lr: float, seed: int = 0, micro_batch_size: int = 16) -> list[float]:
    """``steps`` supervised steps on random batches of ``demonstrations``, in place on ``model``; the losses."""
    if not demonstrations:
        raise ValueError("a warm start needs at least one demonstration")
    rng = random.Random(seed)
    size = min(batch_size, len(demonstrations))
    trainer = LocalRLOOTrainer(model, default_actor_config(1, size, micro_batch_size), lr=lr)
    batch = pad_rollouts([d.fields for d in demonstrations], pad_token_id=pad_token_id)
    losses = []
    for step in range(1, steps + 1):
        losses.append(trainer.supervised_step(batch.select(rng.sample(range(len(demonstrations)), size))))
        if step % 50 == 0 or step == steps:
            logger.info("warm start: step %d/%d, loss %.3f", step, steps, statistics.fmean(losses[-50:]))
    return losses
