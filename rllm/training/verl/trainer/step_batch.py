"""What the training guards read of a step's batch, from verl's TransferQueue.

The pinned verl's v1 trainer keeps a step's rows in TransferQueue (``transfer_queue.kv_batch_get``), one
row per agent-loop output, keyed ``{uid}_{session_id}_{index}``: ``uid`` is the prompt's group,
``session_id`` the rollout within it. The guards count rollouts, not rows, so the rows of one
rollout (``uid``, ``session_id``) are read as one. Padding rows (tagged ``is_padding``) are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rllm.training.verl.trainer.guards import RolloutCounts, StepRollouts
from rllm.training.verl.verl_internals import (
    TQ_ADVANTAGES,
    TQ_CALCULATE_ENTROPY,
    TQ_COMPUTE_LOSS,
    TQ_EXTRA_FIELDS,
    TQ_EXTRA_INFO,
    TQ_LOG_PROBS,
    TQ_OLD_LOG_PROBS,
    TQ_PADDING_TAG,
    TQ_PROMPTS,
    TQ_RESPONSE_MASK,
    TQ_RETURNS,
    TQ_RM_SCORES,
    TQ_ROLLOUT_LOG_PROBS,
    TQ_ROW_INDEX,
    TQ_SESSION_ID,
    TQ_TEMPERATURE,
    TQ_UID,
)

_ROW_FIELDS = (TQ_UID, TQ_SESSION_ID, TQ_RM_SCORES, TQ_PROMPTS, TQ_EXTRA_FIELDS, TQ_EXTRA_INFO)


def _rows(value: Any) -> list[Any]:
    """The rows of a TransferQueue field: tensors (nested or padded) unbound, other columns as a list."""
    if hasattr(value, "unbind"):
        return list(value.unbind(0))
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def kept_keys(batch: Any) -> list[str]:
    """The keys of the batch's real rows (verl pads a batch with rows tagged ``is_padding``)."""
    return [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get(TQ_PADDING_TAG, False)]


@dataclass
class LogProbPairs:
    """Per compared rollout, the log-probs its sampled tokens were sampled with and the actor's for the same tokens."""

    rollout: list[list[float]]
    actor: list[list[float]]


def _pairs(sampled: Any, actor: Any, masks: Any) -> LogProbPairs:
    pairs = LogProbPairs([], [])
    for mask, rollout_lp, actor_lp in zip(_rows(masks), _rows(sampled), _rows(actor), strict=True):
        picked = mask.bool()
        length = min(len(picked), len(rollout_lp), len(actor_lp))
        pairs.rollout.append(rollout_lp[:length][picked[:length]].tolist())
        pairs.actor.append(actor_lp[:length][picked[:length]].tolist())
    return pairs


def read_logprob_pairs(batch: Any) -> LogProbPairs:
    """Every real row's sampled and actor log-probs, after verl recomputed them (``old_log_probs``)."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=kept_keys(batch), partition_id=batch.partition_id,
                           select_fields=[TQ_ROLLOUT_LOG_PROBS, TQ_OLD_LOG_PROBS, TQ_RESPONSE_MASK])
    return _pairs(data[TQ_ROLLOUT_LOG_PROBS], data[TQ_OLD_LOG_PROBS], data[TQ_RESPONSE_MASK])


def audit_logprob_pairs(worker_group: Any, batch: Any, rows: int, temperature: float,
                        micro_batch_size: int = 1) -> LogProbPairs:
    """The actor's log-probs recomputed for ``rows`` of the batch.

    ``rows`` is rounded up to whole micro-batches on every data-parallel rank (the actor splits only whole
    ones), and down to what the batch holds.

    verl's bypass mode trains against the rollout's own log-probs, so nothing compares them with the
    actor's; this asks the actor (verl's ``compute_log_prob``) for the first rows' log-probs, as
    verl's decoupled mode does for all of them, before the update.
    """
    import transfer_queue as tq
    from verl.workers.utils.padding import response_from_nested

    keys = kept_keys(batch)
    size = max(int(getattr(worker_group, "world_size", 1) or 1), 1) * max(micro_batch_size, 1)
    count = min(len(keys), -(-max(rows, 1) // size) * size)
    count -= count % size
    if count == 0:
        return LogProbPairs([], [])
    sample = batch.select_keys(keys[:count])
    sample.extra_info.update({TQ_CALCULATE_ENTROPY: False, TQ_COMPUTE_LOSS: False, TQ_TEMPERATURE: temperature})
    worker_group.compute_log_prob(sample)
    data = tq.kv_batch_get(keys=sample.keys, partition_id=sample.partition_id,
                           select_fields=[TQ_LOG_PROBS, TQ_ROLLOUT_LOG_PROBS, TQ_RESPONSE_MASK])
    actor = response_from_nested(data[TQ_LOG_PROBS], data[TQ_RESPONSE_MASK])
    return _pairs(data[TQ_ROLLOUT_LOG_PROBS], actor, data[TQ_RESPONSE_MASK])


def _row_index(info: Any) -> Any:
    return info.get(TQ_ROW_INDEX) if isinstance(info, dict) else None


_COUNT_FIELDS = {"model_calls": "num_model_calls", "samples": "num_samples",
                 "malformed_tool_calls": "num_malformed_tool_calls", "side_calls": "num_side_calls",
                 "discarded_answers": "num_discarded_answers", "rewritten_calls": "num_rewritten_calls"}
"""``RolloutCounts`` field: the agent loop's ``extra_fields`` key it is read from."""


def _counts(extra: dict[str, Any]) -> RolloutCounts | None:
    """What the loop reported of a rollout beyond its reward; ``None`` when it reported none of it."""
    if "num_model_calls" not in extra:
        return None
    values = {name: float(extra[key]) for name, key in _COUNT_FIELDS.items() if extra.get(key) is not None}
    tools = extra.get("num_tools")
    return RolloutCounts(**values, tools=None if tools is None or int(tools) < 0 else int(tools))  # -1: unknown


def read_step(batch: Any, rollouts_per_prompt: int | None = None) -> StepRollouts:
    """The step's rollouts as the guards read them: a rollout's rows (its samples) merged, in key order.

    Every sample carries its rollout's ``extra_fields``: its task (``task_prompt``), ending and counts.

    The log-prob pairs are not among them: they exist only after the actor's audit, later in the step.
    """
    import transfer_queue as tq

    keys = kept_keys(batch)
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(_ROW_FIELDS))
    columns = {name: _rows(data[name]) for name in _ROW_FIELDS}
    order: list[tuple[Any, Any]] = []
    merged: dict[tuple[Any, Any], dict[str, Any]] = {}
    for i in range(len(keys)):
        identity = (columns[TQ_UID][i], columns[TQ_SESSION_ID][i])
        extra = columns[TQ_EXTRA_FIELDS][i] if isinstance(columns[TQ_EXTRA_FIELDS][i], dict) else {}
        if identity not in merged:
            order.append(identity)
            merged[identity] = {"prompt": [int(t) for t in columns[TQ_PROMPTS][i].tolist()],
                                "row": _row_index(columns[TQ_EXTRA_INFO][i]), "truncated": None, "calls": None,
                                "task": extra.get("task_prompt"), "ending": extra.get("termination_reason"),
                                "counts": _counts(extra)}
        rollout = merged[identity]
        rollout["reward"] = float(columns[TQ_RM_SCORES][i].sum())  # every sample carries the rollout's reward
        if "response_truncated" in extra:
            rollout["truncated"] = bool(rollout["truncated"]) or bool(extra["response_truncated"])
        if extra.get("num_tool_calls") is not None:
            rollout["calls"] = float(extra["num_tool_calls"])
    rollouts = [merged[identity] for identity in order]
    return StepRollouts(
        groups=[identity[0] for identity in order], rewards=[r["reward"] for r in rollouts],
        prompts=[r["prompt"] for r in rollouts], rows=[r["row"] for r in rollouts],
        truncated=[r["truncated"] for r in rollouts], tool_calls=[r["calls"] for r in rollouts],
        tasks=[r["task"] for r in rollouts], endings=[r["ending"] for r in rollouts],
        counts=[r["counts"] for r in rollouts], rollouts_per_prompt=rollouts_per_prompt)


def read_advantages(batch: Any) -> tuple[Sequence[Any], list[list[float]]]:
    """Each real row's group and the advantages of its sampled tokens (after verl computed them)."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=kept_keys(batch), partition_id=batch.partition_id,
                           select_fields=[TQ_UID, TQ_ADVANTAGES, TQ_RESPONSE_MASK])
    advantages = [values[mask.bool()].tolist() if len(values) == len(mask) else values.tolist()
                  for values, mask in zip(_rows(data[TQ_ADVANTAGES]), _rows(data[TQ_RESPONSE_MASK]), strict=True)]
    return _rows(data[TQ_UID]), advantages


def write_rollout_advantages(batch: Any) -> Any:
    """Replace verl's row-wise RLOO advantages with ``rollout_advantages`` (a rollout counted once), in verl's layout.

    Every row of the batch takes part, as in verl's own ``_compute_advantage``; each row's advantage
    is its rollout's, on its sampled tokens (``response_mask``), written as ``advantages`` and
    ``returns`` in verl's nested layout.
    """
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    from rllm.training.verl.trainer.advantage import rollout_advantages

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=[TQ_UID, TQ_RM_SCORES, TQ_RESPONSE_MASK])
    scores = [float(row.sum()) for row in _rows(data[TQ_RM_SCORES])]
    advantages = rollout_advantages(batch.keys, _rows(data[TQ_UID]), scores)
    masks = _rows(data[TQ_RESPONSE_MASK])
    rows = [value * mask.to(torch.float32) for value, mask in zip(advantages, masks, strict=True)]
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    fields = TensorDict({TQ_ADVANTAGES: nested, TQ_RETURNS: nested.clone()}, batch_size=len(rows))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
