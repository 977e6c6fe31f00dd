"""Rollouts as one padded training batch, laid out as verl's agent loop lays it out.

verl's ``AgentLoopWorker._agent_loop_postprocess`` (in the verl ``VERL_VERSION`` pins) pads each
trajectory's prompt on the left to ``prompt_length`` and its response on the right to ``response_length``, concatenates
them into ``input_ids``, takes the attention mask from the padding, ``position_ids`` from the
mask (``compute_position_id_with_mask``), ``response_mask`` as the trajectory's loss mask times
the response's attention mask, and pads ``rollout_log_probs`` with 0.0. ``pad_rollouts`` builds
the same tensors from ``TokenTrace.to_verl`` fields, so a local trainer reads exactly what verl's
actor would read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from verl.utils.model import compute_position_id_with_mask

from rllm.errors import ConfigurationError, TokenTraceError


@dataclass
class RolloutBatch:
    """A padded batch of trajectories (verl's field names and layout).

    Attributes:
        input_ids: ``[B, P + R]`` left-padded prompts followed by right-padded responses.
        attention_mask: ``[B, P + R]`` 1 on real tokens.
        position_ids: ``[B, P + R]`` positions counted over real tokens.
        responses: ``[B, R]`` response token ids (sampled and tool tokens).
        response_mask: ``[B, R]`` 1 exactly on sampled tokens (the loss mask).
        rollout_log_probs: ``[B, R]`` the sampler's logprob of each sampled token, 0.0 elsewhere.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor

    @property
    def response_length(self) -> int:
        return int(self.responses.shape[1])

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: slice | Sequence[int]) -> RolloutBatch:
        """The batch restricted to ``rows`` (a slice or indices)."""
        index: Any = rows if isinstance(rows, slice) else torch.as_tensor(list(rows), dtype=torch.long)
        return RolloutBatch(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})


def pad_rollouts(
    rollouts: Sequence[dict[str, Any]], *, pad_token_id: int, prompt_length: int | None = None,
    response_length: int | None = None,
) -> RolloutBatch:
    """Pad ``TokenTrace.to_verl`` dicts into a ``RolloutBatch``.

    ``prompt_length`` / ``response_length`` default to the longest prompt / response; a longer
    one raises ``TokenTraceError`` (cut responses with ``to_verl(max_response_length)`` first,
    as verl's loop does; a prompt is never cut).
    """
    if not rollouts:
        raise ConfigurationError("pad_rollouts needs at least one rollout")
    prompts = [list(r["prompt_ids"]) for r in rollouts]
    responses = [list(r["response_ids"]) for r in rollouts]
    p_len = prompt_length if prompt_length is not None else max(len(p) for p in prompts)
    r_len = response_length if response_length is not None else max(len(r) for r in responses)
    rows = len(rollouts)
    input_ids = torch.full((rows, p_len + r_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, p_len + r_len), dtype=torch.long)
    mask = torch.zeros((rows, r_len), dtype=torch.long)
    logprobs = torch.zeros((rows, r_len), dtype=torch.float32)
    for i, (rollout, prompt, response) in enumerate(zip(rollouts, prompts, responses, strict=True)):
        if len(prompt) > p_len or len(response) > r_len:
            raise TokenTraceError(f"rollout {i}: prompt {len(prompt)} / response {len(response)} tokens do not fit "
                                  f"prompt_length {p_len} / response_length {r_len}")
        loss_mask = list(rollout["response_mask"])
        if len(loss_mask) != len(response):
            raise TokenTraceError(f"rollout {i}: {len(loss_mask)} mask entries for {len(response)} response tokens")
        input_ids[i, p_len - len(prompt) : p_len] = torch.tensor(prompt, dtype=torch.long)
        attention[i, p_len - len(prompt) : p_len] = 1
        input_ids[i, p_len : p_len + len(response)] = torch.tensor(response, dtype=torch.long)
        attention[i, p_len : p_len + len(response)] = 1
        mask[i, : len(response)] = torch.tensor(loss_mask, dtype=torch.long)
        sampled = rollout.get("response_logprobs")
        if sampled is not None:
            logprobs[i, : len(response)] = torch.tensor(sampled, dtype=torch.float32)
    position_ids = compute_position_id_with_mask(attention)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        responses=input_ids[:, p_len:].clone(),
        response_mask=mask,
        rollout_log_probs=logprobs,
    )
