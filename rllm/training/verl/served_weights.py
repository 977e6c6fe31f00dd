"""The served weights proven equal to the trained ones after every weight sync, each side fingerprinted on its own.

After verl's sync, the FSDP actor fingerprints the parameters it holds (in its own process, in the
rollout's dtype, gathering each shard as verl's sync does) and every rollout server fingerprints the
weights it serves (``rllm.training.verl.fingerprint``). Any served tensor whose digest is not the
actor's stops the run with the step and the tensor's name: a sync that re-sent old tensors, skipped
one, merged a LoRA adapter wrongly or cast it differently. Transport checks (what arrived equals what
was sent) cannot see an update that never reached the sender; this can.

Implemented for the embedded backend (``rllm_embedded``). vLLM and SGLang serve fused tensors under
their own names (``qkv_proj``, ``gate_up_proj``); their fingerprint is not written (see the README's
guard table): the log-prob gap guard is their check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import ray
import torch

from rllm.errors import TrainingGuardError
from rllm.training.verl.embedded import server_name, serving_dtype
from rllm.training.verl.fingerprint import WeightFingerprint
from rllm.training.verl.verl_internals import actor_module, call_on_actor

logger = logging.getLogger(__name__)

PREFIX = "rllm/weights/"


def _gathered(module: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's state, each sharded tensor gathered whole (collective: every rank, the same order)."""
    for name, tensor in module.state_dict().items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _actor_fingerprint(fused_worker: Any, dtype_name: str) -> dict[str, str] | None:
    """Runs in every FSDP worker: the actor's parameters, gathered one at a time, fingerprinted on rank 0.

    Each gathered tensor is hashed and dropped before the next, so no rank holds the whole model at once.
    """
    tensors = _gathered(actor_module(fused_worker))
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        for _ in tensors:  # take part in every gather; rank 0 answers
            pass
        return None
    return WeightFingerprint.of(tensors, serving_dtype(dtype_name)).tensors  # type: ignore[arg-type]


def actor_fingerprint(worker_group: Any, dtype_name: str) -> WeightFingerprint:
    """The actor's fingerprint, computed in its FSDP workers (all of them take part; rank 0 answers)."""
    answers = ray.get([call_on_actor(worker, _actor_fingerprint, dtype_name) for worker in worker_group.workers])
    return WeightFingerprint(next(a for a in answers if a is not None))


def served_fingerprints() -> list[WeightFingerprint]:
    """Every embedded rollout server's fingerprint of the weights it serves now, by replica."""
    found: list[WeightFingerprint] = []
    while True:
        try:
            server = ray.get_actor(server_name(len(found)))
        except ValueError:
            return found
        found.append(WeightFingerprint(ray.get(server.weights_fingerprint.remote())))


class ServedWeightsCheck:
    """Compares the served weights with the actor's after each sync; stops on a difference.

    Attributes:
        previous: The served fingerprint's digest after the previous sync, per replica.
    """

    def __init__(self) -> None:
        self.previous: list[str] = []

    def check(self, step: int, actor: WeightFingerprint, served: list[WeightFingerprint]) -> dict[str, float]:
        """Metrics of this sync; ``TrainingGuardError`` naming the step and the first differing tensor."""
        if not served:
            raise TrainingGuardError(f"step {step}: no rollout server answered with the weights it serves", step=step)
        for replica, fingerprint in enumerate(served):
            different = fingerprint.differences(actor)
            if different:
                missing = [n for n in different if n not in actor.tensors]
                what = (f"{different[0]} is not among the actor's parameters" if different[0] in missing
                        else f"{different[0]} differs from the actor's")
                raise TrainingGuardError(
                    f"step {step}: after the weight sync, rollout server {replica} serves weights that are not the "
                    f"actor's: {what} ({len(different)} of {len(fingerprint.tensors)} tensors differ); the rollouts "
                    "would sample from a policy that is not the one being trained", step=step)
        digests = [f.digest for f in served]
        changed = float(bool(self.previous) and digests != self.previous)
        self.previous = digests
        logger.info("step %d: the served weights are the actor's (fingerprint %s)", step, digests[0][:12])
        return {f"{PREFIX}fingerprint_match": 1.0, f"{PREFIX}changed": changed, f"{PREFIX}replicas": float(len(served)),
                f"{PREFIX}version": float(step)}
