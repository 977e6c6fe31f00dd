"""The served weights proven equal to the trained ones after every weight sync, each side fingerprinted on its own.

After verl's sync, the FSDP actor fingerprints the parameters it holds (in its own process, in the
rollout's dtype, gathering each shard as verl's sync does) and every rollout server fingerprints the
weights it serves (``rllm.training.verl.weights.fingerprint``). Any served tensor whose digest is not the
actor's stops the run with the step and the tensor's name: a sync that re-sent old tensors, skipped
one, merged a LoRA adapter wrongly or cast it differently. Transport checks (what arrived equals what
was sent) cannot see an update that never reached the sender; this can.

The embedded backend (``rllm_embedded``) and vLLM with one tensor-parallel rank answer in the actor's
names and digests: compared value for value. SGLang, and vLLM over several ranks, answer in their own
names and digests (``rllm.training.verl.weights.engine_weights``): each served tensor must change exactly when
the actor parameters it is made of change. ``rllm.guards.served_weights: false`` turns the check off.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
import torch

from rllm.errors import ConfigurationError, TrainingGuardError
from rllm.training.verl.embedded import BACKEND_NAME, server_name, serving_dtype
from rllm.training.verl.verl_internals import actor_module, call_on_actor, rollout_replicas
from rllm.training.verl.weights.engine_weights import ServedWeights, sglang_served_weights, vllm_served_weights
from rllm.training.verl.weights.fingerprint import WeightFingerprint

logger = logging.getLogger(__name__)

PREFIX = "rllm/weights/"
READERS = (BACKEND_NAME, "vllm", "sglang")
"""The rollout backends (``rollout.name``) whose served weights rllm reads."""


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


@dataclass(frozen=True)
class TrainableCount:
    """What the actor trains: its parameters by count (peft's own count for a LoRA actor).

    Attributes:
        trainable: Parameters the optimizer updates.
        total: All parameters of the actor (a LoRA actor's frozen base included).
        adapter: Whether the actor is a peft (LoRA) model.
        outside_adapter: Names of trainable parameters that are not the adapter's (empty for a sound LoRA actor).
        peak_rss_bytes: The actor worker's peak resident memory so far (weights, gradients, optimizer state and
            activations on CPU; on a GPU, verl's ``actor/perf/max_memory_allocated_gb`` says the device's).
    """

    trainable: int
    total: int
    adapter: bool
    outside_adapter: tuple[str, ...] = ()
    peak_rss_bytes: int = 0

    def metrics(self) -> dict[str, float]:
        """``rllm/actor/*``: trainable and total parameters, the worker's peak resident memory in GB."""
        return {"rllm/actor/trainable_params": float(self.trainable), "rllm/actor/params": float(self.total),
                "rllm/actor/peak_rss_gb": self.peak_rss_bytes / 1024**3}


def _count_trainable(fused_worker: Any) -> TrainableCount:
    """Runs in an FSDP worker: the actor's trainable and total parameters (a sharded one counted whole)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    module = actor_module(fused_worker)
    inner = getattr(module, "_fsdp_wrapped_module", module)
    if hasattr(inner, "get_nb_trainable_parameters"):  # peft's count
        trainable, total = inner.get_nb_trainable_parameters()
        outside = tuple(name for name, parameter in inner.named_parameters()
                        if parameter.requires_grad and ".lora_" not in name)
        return TrainableCount(int(trainable), int(total), True, outside, peak)
    parameters = list(module.parameters())
    return TrainableCount(sum(p.numel() for p in parameters if p.requires_grad), sum(p.numel() for p in parameters),
                          False, peak_rss_bytes=peak)


def actor_trainable(worker_group: Any) -> TrainableCount:
    """The actor's ``TrainableCount``, read in its first FSDP worker."""
    return ray.get(call_on_actor(worker_group.workers[0], _count_trainable))


def embedded_served_weights() -> list[ServedWeights]:
    """Every embedded rollout server's fingerprint of the weights it serves now, by replica."""
    found: list[ServedWeights] = []
    while True:
        try:
            server = ray.get_actor(server_name(len(found)))
        except ValueError:
            return found
        found.append(ServedWeights(WeightFingerprint(ray.get(server.weights_fingerprint.remote()))))


def served_weights(rollout_name: str, trainer: Any) -> list[ServedWeights]:
    """What every rollout replica of ``trainer`` serves now, read the way its backend allows."""
    if rollout_name == BACKEND_NAME:
        return embedded_served_weights()
    replicas = rollout_replicas(trainer)
    if rollout_name == "vllm":
        return vllm_served_weights([list(replica.servers) for replica in replicas])
    if rollout_name == "sglang":
        return sglang_served_weights([replica.server_address for replica in replicas])
    raise ConfigurationError(f"actor_rollout_ref.rollout.name={rollout_name}: rllm reads the served weights of "
                             f"{READERS} only; set rllm.guards.served_weights=false to train without the check")


class ServedWeightsCheck:
    """Compares the served weights with the actor's after each sync; stops on a difference.

    Attributes:
        previous: The served fingerprints after the previous sync, per replica.
        previous_actor: The actor's fingerprint at the previous sync.
    """

    def __init__(self) -> None:
        self.previous: list[WeightFingerprint] = []
        self.previous_actor: WeightFingerprint | None = None

    def check(self, step: int, actor: WeightFingerprint, served: list[ServedWeights]) -> dict[str, float]:
        """Metrics of this sync; ``TrainingGuardError`` naming the step, the replica and the first wrong tensor."""
        if not served:
            raise TrainingGuardError(f"step {step}: no rollout server answered with the weights it serves", step=step)
        for replica, report in enumerate(served):
            problem = (_not_equal(report.fingerprint, actor) if report.exact
                       else self._not_following(replica, report, actor))
            if problem:
                raise TrainingGuardError(
                    f"step {step}: after the weight sync, rollout server {replica} serves weights that are not the "
                    f"actor's: {problem}; the rollouts would sample from a policy that is not the one being trained",
                    step=step)
        digests = [report.fingerprint.digest for report in served]
        changed = float(bool(self.previous) and digests != [f.digest for f in self.previous])
        self.previous = [report.fingerprint for report in served]
        self.previous_actor = actor
        exact = all(report.exact for report in served)
        logger.info("step %d: the served weights %s (fingerprint %s)", step,
                    "are the actor's" if exact else "changed with the actor's", digests[0][:12])
        return {f"{PREFIX}fingerprint_match": 1.0, f"{PREFIX}changed": changed, f"{PREFIX}replicas": float(len(served)),
                f"{PREFIX}version": float(step), f"{PREFIX}exact": float(exact)}

    def _not_following(self, replica: int, report: ServedWeights, actor: WeightFingerprint) -> str:
        """What in an engine-named report did not change with the actor since the previous sync ("" when all did)."""
        parts = {name: report.actor_parts(name, actor.tensors) for name in report.fingerprint.tensors}
        unmapped = sorted(name for name, found in parts.items() if found is None)
        if unmapped:
            return (f"rllm cannot tell which actor parameters its tensor {unmapped[0]} is made of ({len(unmapped)} "
                    "such tensors), so it cannot check them; set rllm.guards.served_weights=false to train without "
                    "the check")
        if self.previous_actor is None or replica >= len(self.previous):
            return ""
        before, actor_before = self.previous[replica].tensors, self.previous_actor.tensors
        for name, digest in sorted(report.fingerprint.tensors.items()):
            moved = before.get(name) != digest
            actor_moved = [part for part in parts[name] or [] if actor_before.get(part) != actor.tensors[part]]
            if actor_moved and not moved:
                return (f"{name} is the one it served before the sync although the actor's {actor_moved[0]} changed "
                        "(the update did not arrive)")
            if moved and not actor_moved:
                return f"{name} changed although the actor's {', '.join(parts[name] or [])} did not"
        return ""


def _not_equal(served: WeightFingerprint, actor: WeightFingerprint) -> str:
    """What in an actor-named fingerprint differs from the actor's ("" when nothing does)."""
    different = served.differences(actor)
    if not different:
        return ""
    what = (f"{different[0]} is not among the actor's parameters" if different[0] not in actor.tensors
            else f"{different[0]} differs from the actor's")
    return f"{what} ({len(different)} of {len(served.tensors)} tensors differ)"
