"""``EmbeddedServerAdapter``: verl's ``BaseRollout`` for the embedded backend, inside each FSDP worker."""

from __future__ import annotations

from typing import Any

import ray
import torch

from rllm.training.verl.embedded import server_name, serving_dtype
from rllm.training.verl.weights.fingerprint import WeightFingerprint, tensor_digest

_BUCKET_BYTES = 512 << 20
"""Weights sent to the server per Ray call: bounds the copies held at once."""


def _rollout_base() -> type:
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class EmbeddedServerAdapter(_rollout_base()):  # type: ignore[misc]
    """verl's ``BaseRollout`` for the embedded backend, in each FSDP worker: weights to the server, memory control."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        self.dtype: Any = serving_dtype(self.config.dtype)
        replica_size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                        * self.config.pipeline_model_parallel_size)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank, self.is_leader = rank // replica_size, rank % replica_size == 0
        self._server: Any = None

    @property
    def server(self) -> Any:
        """The replica's server actor (found by name: it is started after the workers)."""
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Put the weights back on the device before a sync (``weights``); the cache needs nothing."""
        if self.is_leader and "weights" in tags:
            await self.server.wake_up.remote()

    async def release(self) -> None:
        """Free the server's device memory."""
        if self.is_leader:
            await self.server.sleep.remote()

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        """Send the actor's full tensors to the server in buckets; the server checks that they arrived unchanged.

        Every rank drains ``weights`` (verl gathers each tensor collectively); only the replica's
        first rank sends. With LoRA (verl's default ``lora.merge=false``) verl hands the adapter's tensors
        and its ``peft_config`` (or, once, the frozen base with ``base_sync_done=False``): the server serves
        base plus adapter, the way vLLM serves a LoRA. A merged LoRA arrives as full tensors.
        A delta flush is refused with a clear error.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the embedded rollout backend takes full tensors, not {wire_format!r}")
        peft_config = kwargs.get("peft_config")
        part = "full" if peft_config is None else ("adapter" if kwargs.get("base_sync_done", True) else "base")
        sent = WeightFingerprint()
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        if self.is_leader:
            await self.server.begin_weight_update.remote(peft_config, part)
        for name, tensor in weights:
            if not self.is_leader:
                continue
            served = tensor.detach().to("cpu", self.dtype, copy=True)
            sent.tensors[name] = tensor_digest(name, served)
            bucket[name] = served
            size += served.numel() * served.element_size()
            if size >= _BUCKET_BYTES:
                await self.server.load_weights.remote(bucket)
                bucket, size = {}, 0
        if not self.is_leader:
            return
        if bucket:
            await self.server.load_weights.remote(bucket)
        await self.server.finish_weight_update.remote(kwargs.get("global_steps"), sent.digest)
