"""A supervised warm start on demonstrations: next-token loss on the tokens a teacher's rollouts sampled.

The demonstrations are ``Rollout``s from ``run_rollouts`` with a teacher engine
(``MessageScriptedEngine``), so their tokens come from the same runner and incremental renderer
as the policy's own rollouts. The loss is verl's SFT loss (``agg_loss``, token-mean) of the
negative log-probs of their sampled tokens.

Rollouts of one agent begin with the same tokens (the system prompt and the tool schemas: 213 of
the lookup prompt's ~228), so ``supervised_step`` runs that shared prefix once per micro-batch and
every row continues from its cached keys and values, and it computes logits only where a sampled
token is predicted. Same loss and gradient as the padded batch (``LocalRLOOTrainer.log_probs``
layout; ``tests/rllm/training/local/test_warm_start.py`` checks both), about 3x faster on a CPU.
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss

from rllm.errors import ConfigurationError
from rllm.training.local.rollouts import Rollout

logger = logging.getLogger(__name__)


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix every sequence starts with (at most one token short of the shortest)."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    length = 0
    while length < shortest - 1 and all(s[length] == sequences[0][length] for s in sequences):
        length += 1
    return length


def _rows_tensors(rows: Sequence[dict[str, Any]], prefix: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, attention mask and loss mask of every row after ``prefix`` tokens, right-padded."""
    suffixes = [list(r["prompt_ids"][prefix:]) + list(r["response_ids"]) for r in rows]
    masks = [[0] * (len(r["prompt_ids"]) - prefix) + list(r["response_mask"]) for r in rows]
    width = max(len(s) for s in suffixes)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (suffix, mask) in enumerate(zip(suffixes, masks, strict=True)):
        if len(mask) != len(suffix):
            raise ValueError(f"row {i}: {len(mask)} loss-mask entries for {len(suffix)} tokens")
        ids[i, : len(suffix)] = torch.tensor(suffix)
        attention[i, : len(suffix)] = 1
        loss_mask[i, : len(suffix)] = torch.tensor(mask, dtype=torch.bool)
    return ids, attention, loss_mask


def sampled_log_probs(model: Any, rows: Sequence[dict[str, Any]], *, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of every sampled token of ``rows`` (``TokenTrace.to_verl`` fields), in row order, with gradients.

    The rows' shared prefix runs once (batch 1), its cache is broadcast to every row, and only the
    positions that predict a sampled token go through the output layer.
    """
    device = next(model.parameters()).device
    prefix = shared_prefix_length([list(r["prompt_ids"]) + list(r["response_ids"]) for r in rows])
    prefix = max(min(prefix, min(len(r["prompt_ids"]) for r in rows)), 1)
    ids, attention, loss_mask = (t.to(device) for t in _rows_tensors(rows, prefix))
    batch, width = ids.shape
    head = torch.tensor([list(rows[0]["prompt_ids"][:prefix])], dtype=torch.long, device=device)
    shared = model.model(input_ids=head, use_cache=True)
    cache = shared.past_key_values
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1)
    positions = (prefix + torch.arange(width, device=device)).expand(batch, width)
    full_attention = torch.cat([torch.ones((batch, prefix), dtype=attention.dtype, device=device), attention], dim=1)
    hidden = model.model(input_ids=ids, attention_mask=full_attention, position_ids=positions,
                         past_key_values=cache, use_cache=True).last_hidden_state
    # Token t is predicted at position t - 1: the first suffix token at the prefix's last position.
    predicting = torch.cat([shared.last_hidden_state[:, -1:, :].expand(batch, -1, -1), hidden[:, :-1]], dim=1)
    logits = model.lm_head(predicting[loss_mask]).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[loss_mask].unsqueeze(-1)).squeeze(-1)


def supervised_step(model: Any, optimizer: torch.optim.Optimizer, rows: Sequence[dict[str, Any]], *,
                    micro_batch_size: int = 16, grad_clip: float = 1.0) -> float:
    """One optimizer step of token-mean next-token loss on the sampled tokens of ``rows``; the loss.

    Micro-batches add up to the whole batch's token-mean (verl's ``agg_loss`` with the batch's token
    count), so ``micro_batch_size`` changes memory, not the gradient; rows of similar length share
    one (sorted by length), so little of a micro-batch is padding.
    """
    if not rows:
        raise ConfigurationError("a supervised step needs at least one row")
    tokens = sum(int(sum(r["response_mask"])) for r in rows)
    if tokens == 0:
        raise ConfigurationError("the rows have no sampled tokens to learn from")
    rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for start in range(0, len(rows), max(micro_batch_size, 1)):
        log_probs = sampled_log_probs(model, rows[start:start + micro_batch_size])
        loss = agg_loss(-log_probs.unsqueeze(0), torch.ones_like(log_probs).unsqueeze(0), "token-mean",
                        batch_num_tokens=tokens)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    model.eval()
    return total


def warm_start(model: Any, demonstrations: Sequence[Rollout], *, steps: int, batch_size: int, lr: float,
               seed: int = 0, micro_batch_size: int = 16, optimizer: torch.optim.Optimizer | None = None,
               warmup_steps: int = 0, log_every: int = 50) -> list[float]:
    """``steps`` supervised steps on random batches of ``demonstrations``, in place on ``model``; the losses.

    ``optimizer`` defaults to AdamW at ``lr`` (verl's betas and weight decay); pass one to keep its
    moments for what follows (the learning proof's RL phase does). The learning rate rises linearly
    to ``lr`` over the first ``warmup_steps`` steps, then stays there.
    """
    if not demonstrations:
        raise ConfigurationError("a warm start needs at least one demonstration")
    if optimizer is None:
        from rllm.training.local.rloo import default_actor_config

        optim = default_actor_config(1, 1).optim
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(float(optim.betas[0]), float(optim.betas[1])),
                                      weight_decay=optim.weight_decay)
    rng = random.Random(seed)
    rows = [d.fields for d in demonstrations]
    size = min(batch_size, len(rows))
    losses = []
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr
        losses.append(supervised_step(model, optimizer, [rows[i] for i in rng.sample(range(len(rows)), size)],
                                      micro_batch_size=micro_batch_size))
        if step % log_every == 0 or step == steps:
            logger.info("warm start: step %d/%d, loss %.3f", step, steps, statistics.fmean(losses[-log_every:]))
    return losses
