"""Training keeps what it trained: a step's rollouts written into the run directory, one JSON line per rollout.

The guarded trainer writes them in its own process (the driver of the step, not a Ray worker), right after
the advantages are computed, from the rows verl's TransferQueue holds for the step: the tokens the actor
trains on (``prompts``, ``responses``, ``response_mask``), the log-probs they were sampled with
(``rollout_log_probs``), the advantages, the reward, and the agent loop's ``extra_fields``, where the loop
left the rollout's task and conversation (``rllm.records.CONVERSATION_FIELD``). A record is
therefore the one record the loop built, with what only the trainer knows (the advantage) added; nothing is
re-rendered. ``rllm.rollout_records`` says which steps and how many rollouts (``RolloutRecordSettings``).

A line of ``rollouts/step_000012.jsonl``::

    {"step": 12, "rollout": "<uid>_<session>", "group": "<uid>", "task": {...}, "task_text": "...",
     "reward": 1.0, "advantage": 0.5, "termination_reason": "finished", "final_answer": "...",
     "trajectories": [{"name": "agent", "conversation": [...]}],    # rllm.records.conversation
     "samples": [{"index": 0, "agent": "agent", "prompt_ids": [...], "response_ids": [...],
                  "loss_mask": [0, 1, ...], "logprobs": [...], "advantage": 0.5,
                  "prompt_tokens": ["<|im_start|>", ...], "response_tokens": [...]}]}

``loss_mask`` is verl's ``response_mask`` (1: trained), ``logprobs`` the sampling log-probs of the response
tokens (0.0 where not sampled), ``advantage`` a sample's advantage on its trained tokens (an outcome
estimator gives every trained token of a rollout the same one).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rllm.records import CONVERSATION_FIELD, ROLLOUTS_DIR, step_file_name, task_text
from rllm.training.verl.trainer.advantage import rollout_of

logger = logging.getLogger(__name__)

RECORD_FIELDS = ("uid", "session_id", "prompts", "responses", "response_mask", "rollout_log_probs", "advantages",
                 "rm_scores", "extra_fields")
"""The TransferQueue fields a record is built from (``rollout_log_probs`` only when the rollout returned them)."""


def _values(row: Any) -> list[Any]:
    if row is None:
        return []
    if hasattr(row, "tolist"):
        return list(row.tolist())
    return list(row)


def _rows(value: Any) -> list[Any]:
    if hasattr(value, "unbind"):
        return list(value.unbind(0))
    if hasattr(value, "tolist") and not isinstance(value, list):
        return list(value.tolist())
    return list(value)


def _extra(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _sample(index: int, extra: dict[str, Any], prompt: list[int], response: list[int], mask: list[int],
            logprobs: list[float], advantages: list[float], decode: Callable[[list[int]], list[str]] | None,
            ) -> dict[str, Any]:
    length = len(response)
    mask = [int(m) for m in mask[:length]]
    trained = [i for i, m in enumerate(mask) if m]
    # verl's advantages are the response's length (or, once masked and packed, the trained tokens' count).
    advantage = (advantages[trained[0]] if len(advantages) == length else advantages[0]) if trained and advantages \
        else 0.0
    sample: dict[str, Any] = {
        "index": int(extra.get("sample_index", index)), "agent": extra.get("agent"),
        "prompt_ids": prompt, "response_ids": response, "loss_mask": mask,
        "logprobs": [round(float(lp), 5) for lp in logprobs[:length]] if logprobs else [],
        "advantage": round(float(advantage), 6)}
    if decode is not None:
        sample["prompt_tokens"], sample["response_tokens"] = decode(prompt), decode(response)
    return sample


def build_records(step: int, keys: Sequence[str], columns: dict[str, Any], *,
                  decode: Callable[[list[int]], list[str]] | None = None,
                  max_rollouts: int | None = None) -> list[dict[str, Any]]:
    """The step's rollouts as records (module docstring), a rollout's rows (``{uid}_{session}_{index}``) as one.

    ``columns`` maps each of ``RECORD_FIELDS`` to the rows' values in ``keys``' order (tensors, nested
    tensors or lists; ``rollout_log_probs`` may be missing); ``decode`` turns token ids into their text
    pieces, one per id; ``max_rollouts`` keeps the first rollouts only.
    """
    rows = {name: _rows(columns[name]) if columns.get(name) is not None else [None] * len(keys)
            for name in RECORD_FIELDS}
    order: list[str] = []
    grouped: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        rollout, _ = rollout_of(key)
        if rollout not in grouped:
            if max_rollouts is not None and len(order) >= max_rollouts:
                continue
            order.append(rollout)
            grouped[rollout] = []
        grouped[rollout].append(i)
    records = []
    for rollout in order:
        indices = sorted(grouped[rollout], key=lambda i: rollout_of(keys[i])[1])
        extras: list[dict[str, Any]] = [_extra(rows["extra_fields"][i]) for i in indices]
        last = extras[-1]
        told = next((extra.get(CONVERSATION_FIELD) for extra in reversed(extras) if extra.get(CONVERSATION_FIELD)),
                    None)
        kept = json.loads(told) if told else {}
        samples = [_sample(n, extra, [int(t) for t in _values(rows["prompts"][i])],
                           [int(t) for t in _values(rows["responses"][i])], _values(rows["response_mask"][i]),
                           _values(rows["rollout_log_probs"][i]), _values(rows["advantages"][i]), decode)
                   for n, (i, extra) in enumerate(zip(indices, extras, strict=True))]
        uid = rows["uid"][indices[-1]]
        task = kept.get("task")
        records.append({
            "step": int(step), "rollout": rollout, "group": str(uid) if uid is not None else rollout_of(rollout)[0],
            "task": task, "task_text": task_text(task),
            "reward": float(sum(_values(rows["rm_scores"][indices[-1]]))),
            "advantage": samples[-1]["advantage"], "termination_reason": last.get("termination_reason"),
            "final_answer": last.get("final_answer"), "truncated": bool(last.get("response_truncated", False)),
            "num_tool_calls": last.get("num_tool_calls"),
            "trajectories": kept.get("trajectories", []), "samples": samples})
    return records


def write_records(run_dir: str | os.PathLike[str], step: int, records: Sequence[dict[str, Any]]) -> Path:
    """Write ``records`` as ``rollouts/step_NNNNNN.jsonl`` of ``run_dir`` (whole or not at all: a rename)."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / step_file_name(step)
    partial = path.with_suffix(".jsonl.partial")
    with partial.open("w", encoding="utf-8") as file:
        for record in records:
            file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    partial.replace(path)
    return path


def token_pieces(tokenizer: Any) -> Callable[[list[int]], list[str]]:
    """``decode`` for ``build_records``: each id as the tokenizer decodes it alone."""

    def decode(ids: list[int]) -> list[str]:
        return list(tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)) if ids else []

    return decode


def write_step_records(batch: Any, step: int, run_dir: str | os.PathLike[str], *, tokenizer: Any = None,
                       max_rollouts: int | None = None, with_logprobs: bool = True) -> Path:
    """Read the step's real rows from verl's TransferQueue and write their records (``build_records``)."""
    import transfer_queue as tq

    from rllm.training.verl.trainer.step_batch import kept_keys

    keys = kept_keys(batch)
    fields = [name for name in RECORD_FIELDS if with_logprobs or name != "rollout_log_probs"]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    records = build_records(step, keys, {name: data[name] for name in fields},
                            decode=token_pieces(tokenizer) if tokenizer is not None else None,
                            max_rollouts=max_rollouts)
    path = write_records(run_dir, step, records)
    logger.info("step %d: %d rollouts recorded in %s", step, len(records), path)
    return path
