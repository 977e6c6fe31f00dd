"""``LocalRLOOTrainer``: RLOO updates on one machine, with verl's own functions for every piece of math.

For proofs, debugging and small models; verl stays the path for real runs. What verl's actor does
in a step, this does in one process on the module the rollout engine samples from:

- log-probs: the model's logits over the response positions, divided by the sampling
  temperature, through ``verl.utils.torch_functional.logprobs_from_logits``;
- ``old_log_prob`` recomputed before the update, as verl's trainer does, and compared with the
  sampler's logprobs (``rollout_ratio_max_dev``: with both on the same weights it is ~0; a stale
  engine or a mismatched template shows here first);
- advantages from ``compute_rloo_outcome_advantage`` with the rollouts grouped by prompt;
- the loss from ``get_policy_loss_fn(actor.policy_loss.loss_mode)`` aggregated by its own
  ``agg_loss`` over the mini-batch (``global_batch_info`` as verl's ``ppo_loss`` fills it), so
  micro-batching does not change the gradient;
- gradient clipping at ``actor.grad_clip``, then the optimizer step.

The actor settings are verl's ``FSDPActorConfig`` (its defaults: vanilla PPO-clip loss,
token-mean, clip 0.2, grad clip 1.0, one PPO epoch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_rloo_outcome_advantage, get_policy_loss_fn
from verl.utils.torch_functional import logprobs_from_logits, masked_mean
from verl.workers.config import FSDPActorConfig

from rllm.errors import ConfigurationError
from rllm.training.local.batch import RolloutBatch


@dataclass
class UpdateMetrics:
    """What one RLOO step did.

    Attributes:
        pg_loss: The policy loss summed over the step's mini-batches.
        grad_norm: Gradient norm before clipping (of the last mini-batch).
        rollout_ratio_max_dev: max |exp(trainer log-prob - sampler logprob) - 1| over sampled
            tokens, before any update: the policy ratio's deviation from 1 at the first update.
        rollout_ratio_mean_dev: The mean of the same over sampled tokens.
        ppo_kl: verl's ``actor/ppo_kl`` of the last mini-batch.
        pg_clipfrac: verl's ``actor/pg_clipfrac`` of the last mini-batch.
        advantage_abs_mean: Mean |advantage| over sampled tokens (0 when every group is uniform).
        tokens: Sampled tokens trained on.
        updates: Optimizer steps taken.
    """

    pg_loss: float
    grad_norm: float
    rollout_ratio_max_dev: float
    rollout_ratio_mean_dev: float
    ppo_kl: float
    pg_clipfrac: float
    advantage_abs_mean: float
    tokens: int
    updates: int


def default_actor_config(
    prompts_per_step: int, rollouts_per_prompt: int, micro_batch_size: int = 16,
) -> FSDPActorConfig:
    """The actor settings of verl, with its defaults, one update per step of ``prompts_per_step`` prompts."""
    return FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=prompts_per_step, rollout_n=rollouts_per_prompt,
                           ppo_micro_batch_size_per_gpu=micro_batch_size)


class LocalRLOOTrainer:
    """Trains ``model`` in place with RLOO; the engine that samples from ``model`` serves the new weights.

    Args:
        model: A causal LM (``transformers`` ``PreTrainedModel``), the module the engine samples from.
        actor: verl's actor settings (``default_actor_config``); its ``ppo_mini_batch_size`` is in
            prompts, times ``rollout_n`` rollouts, as in verl.
        lr: AdamW learning rate (betas and weight decay from ``actor.optim``).
        temperature: The rollouts' sampling temperature (logits are divided by it, as in verl).
        optimizer: Another optimizer over ``model``'s parameters instead of AdamW (``lr`` is then unused).
    """

    def __init__(self, model: Any, actor: FSDPActorConfig, *, lr: float, temperature: float = 1.0,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        if temperature <= 0:
            raise ConfigurationError(f"temperature={temperature}: RLOO trains on sampled rollouts, so it must be > 0")
        self.model = model
        self.actor = actor
        self.temperature = temperature
        optim = actor.optim
        betas = (float(optim.betas[0]), float(optim.betas[1]))
        self.optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, betas=betas,
                                                        weight_decay=optim.weight_decay)
        self.policy_loss = get_policy_loss_fn(actor.policy_loss.loss_mode)

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _micro_slices(self, rows: int) -> list[slice]:
        """Slices of ``rows`` rows, ``actor.ppo_micro_batch_size_per_gpu`` at a time."""
        size = max(int(self.actor.ppo_micro_batch_size_per_gpu or rows), 1)
        return [slice(i, i + size) for i in range(0, rows, size)]

    def _log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs of ``batch.responses`` under the model as it is now ([B, R], float32)."""
        batch = batch.to(self._device)
        length = batch.response_length
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, logits_to_keep=length + 1, use_cache=False)
        logits = out.logits[:, :-1, :].float() / self.temperature
        return logprobs_from_logits(logits, batch.responses)

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs of every response token, without gradients, micro-batched (verl's ``compute_log_prob``)."""
        with torch.no_grad():
            return torch.cat([self._log_probs(batch.select(part)) for part in self._micro_slices(len(batch))])

    def advantages(self, batch: RolloutBatch, rewards: Sequence[float], groups: Sequence[str]) -> torch.Tensor:
        """RLOO advantages ([B, R]) from verl's ``compute_rloo_outcome_advantage``, rollouts grouped by ``groups``."""
        if not len(rewards) == len(groups) == len(batch):
            raise ConfigurationError(f"{len(batch)} rollouts, {len(rewards)} rewards, {len(groups)} groups: give one "
                                     "reward and one group per rollout")
        mask = batch.response_mask.float()
        token_rewards = torch.zeros_like(mask)
        last = (mask.shape[1] - 1 - torch.flip(mask, dims=[1]).argmax(dim=1)).clamp(min=0)
        token_rewards[torch.arange(len(batch)), last] = torch.tensor([float(r) for r in rewards])
        advantages, _ = compute_rloo_outcome_advantage(token_rewards, mask, np.array(list(groups), dtype=object))
        return advantages

    def step(self, batch: RolloutBatch, rewards: Sequence[float], groups: Sequence[str]) -> UpdateMetrics:
        """One RLOO step on ``batch``: old log-probs, advantages, and one update per mini-batch."""
        mask = batch.response_mask.bool()
        old = self.log_probs(batch)
        sampled = batch.rollout_log_probs.to(old.device)
        device_mask = mask.to(old.device)
        deviation = (torch.exp(old - sampled) - 1).abs()[device_mask]
        advantages = self.advantages(batch, rewards, groups)
        rows = max(int(self.actor.ppo_mini_batch_size) * int(self.actor.rollout_n), 1)
        total_loss, grad_norm, metrics, updates = 0.0, 0.0, {}, 0
        self.model.train()
        for start in range(0, len(batch), rows):
            part = slice(start, start + rows)
            mini, mini_old, mini_advantages = batch.select(part), old[part], advantages[part]
            self.actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mini.response_mask.sum()),
                                                global_batch_size=len(mini),
                                                loss_scale_factor=self.actor.loss_scale_factor)
            self.optimizer.zero_grad(set_to_none=True)
            for micro in self._micro_slices(len(mini)):
                log_prob = self._log_probs(mini.select(micro))
                loss, metrics = self.policy_loss(
                    old_log_prob=mini_old[micro], log_prob=log_prob,
                    advantages=mini_advantages[micro].to(log_prob.device),
                    response_mask=mini.response_mask[micro].bool().to(log_prob.device),
                    loss_agg_mode=self.actor.loss_agg_mode, config=self.actor, rollout_is_weights=None,
                )
                loss.backward()
                total_loss += float(loss.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.actor.grad_clip))
            if not math.isfinite(grad_norm):
                raise FloatingPointError(
                    f"gradient norm is {grad_norm}: the update was skipped; lower the learning rate")
            self.optimizer.step()
            updates += 1
        self.model.eval()
        return UpdateMetrics(
            pg_loss=total_loss,
            grad_norm=grad_norm,
            rollout_ratio_max_dev=float(deviation.max()) if deviation.numel() else 0.0,
            rollout_ratio_mean_dev=float(deviation.mean()) if deviation.numel() else 0.0,
            ppo_kl=float(metrics.get("actor/ppo_kl", 0.0)),
            pg_clipfrac=float(metrics.get("actor/pg_clipfrac", 0.0)),
            advantage_abs_mean=float(masked_mean(advantages.abs(), mask.float())),
            tokens=int(mask.sum()),
            updates=updates,
        )
