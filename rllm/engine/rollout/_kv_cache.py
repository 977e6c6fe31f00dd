"""The running batch's KV cache for ``TransformersEngine``: layers with room to grow, and row padding.

A decode step appends one token per row to every layer; ``DynamicCache`` copies the whole cache to
do so, which was half of a batched CPU step. These layers write into room left at their end instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys and values into room left at its end.

    ``DynamicLayer`` concatenates on every update, copying the whole cache once per decode step
    (half the time of a batched step on CPU); this layer copies only the new token, and grows
    only when its room runs out. ``keys`` and ``values`` are views of the filled part.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._length = keys.shape[-2]
        self._keys = self._allocate(keys, self._length + room)
        self._values = self._allocate(values, self._length + room)
        self._expose()

    @staticmethod
    def _allocate(filled: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, heads, length, dim = filled.shape
        buffer = filled.new_zeros((batch, heads, capacity, dim))
        buffer[:, :, :length] = filled
        return buffer

    def _expose(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = keys = self._keys[:, :, : self._length]
        self.values = values = self._values[:, :, : self._length]
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            capacity = end + max(64, end // 4)
            self._keys = self._allocate(self._keys[:, :, : self._length], capacity)
            self._values = self._allocate(self._values[:, :, : self._length], capacity)
        self._keys[:, :, self._length : end] = key_states
        self._values[:, :, self._length : end] = value_states
        self._length = end
        return self._expose()

    def get_seq_length(self) -> int:
        return self._length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys = self._keys[indices]
        self._values = self._values[indices]
        self._expose()


class BatchCache(DynamicCache):
    """The running batch's ``DynamicCache``, built from each layer's (keys, values) with ``room`` tokens to spare."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], room: int) -> None:
        Cache.__init__(self, layers=[RoomyLayer(keys, values, room) for keys, values in layers])


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values), shaped ``[batch, kv_heads, length, head_dim]``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """``tensor`` with zeros prepended along ``dim`` up to ``length``."""
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [missing, 0]
    return F.pad(tensor, pad)
