"""Fingerprints of model weights: one sha256 per tensor over its name, shape, dtype and exact bytes.

The rollout server fingerprints the weights it serves and the FSDP actor the parameters it just
trained, each in its own process and in the serving dtype; equal weights give equal fingerprints
bit for bit, whatever the thread count or device, and a stale, partly loaded, permuted or
differently cast tensor does not. Comparing the two after every weight sync proves that the policy
being sampled is the policy being trained (``rllm.training.verl.trainer.runner``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """sha256 of ``name``, the tensor's shape and dtype, and its exact bytes (on CPU, contiguous)."""
    values = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{name}|{tuple(values.shape)}|{values.dtype}|".encode())
    if values.numel():
        digest.update(values.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class WeightFingerprint:
    """Per tensor name, the ``tensor_digest`` of its value.

    Attributes:
        tensors: Name -> digest.
    """

    tensors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, named_tensors: Iterable[tuple[str, torch.Tensor]],
           dtype: torch.dtype | None = None) -> WeightFingerprint:
        """The fingerprint of ``named_tensors``, each cast to ``dtype`` first (floating-point tensors only)."""
        fingerprint = cls()
        for name, tensor in named_tensors:
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            fingerprint.tensors[name] = tensor_digest(name, tensor)
        return fingerprint

    @property
    def digest(self) -> str:
        """One sha256 over every tensor's digest, by name."""
        combined = hashlib.sha256()
        for name in sorted(self.tensors):
            combined.update(f"{name}={self.tensors[name]};".encode())
        return combined.hexdigest()

    def differences(self, reference: WeightFingerprint) -> list[str]:
        """Names of this fingerprint's tensors that ``reference`` lacks or holds with other values, sorted."""
        return sorted(name for name, digest in self.tensors.items() if reference.tensors.get(name) != digest)
