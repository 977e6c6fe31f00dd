"""Exact flat search in torch: the GPU search path for machines where faiss-gpu cannot be loaded.

Inner product or L2 over vectors stored as float16 (or float32) on one or more devices, sharded
by rows; each query batch is cut into chunks whose score matrix fits a memory budget, every
shard scores and ranks its rows, and the shards' top-k are merged on the host. It runs wherever
torch runs (CUDA, or CPU for tests), and returns what ``faiss.IndexFlat.search`` returns: float32
scores (inner products, or squared L2 distances) and int64 ids, best first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.errors import TorchSearchError
from rag.manifest import Metric

logger = logging.getLogger(__name__)

_ROWS_PER_COPY = 1 << 18  # host -> device copies in slices, so building a shard never needs a second full copy


class _Shard:
    def __init__(self, vectors: Any, norms: Any | None, offset: int) -> None:
        self.vectors = vectors  # (rows, dim) on its device
        self.norms = norms  # (rows,) float32 squared norms, L2 only
        self.offset = offset

    @property
    def rows(self) -> int:
        return int(self.vectors.shape[0])


class TorchFlatIndex:
    """Exact inner-product or L2 search over ``vectors`` sharded across ``devices``.

    Args:
        vectors: ``(n, dim)`` float array, or a callable ``rows(start, stop) -> array`` so that a
            large index is copied to the devices slice by slice (e.g. a FAISS index's ``reconstruct_n``).
        metric: ``ip`` (larger is better) or ``l2`` (squared distance, smaller is better).
        devices: Torch devices, one shard each (``["cuda:0", "cuda:1"]``; ``["cpu"]`` for tests).
        fp16: Store vectors as float16 (halves memory; scores are accumulated and returned as float32).
        chunk_mb: Memory budget for one chunk's score matrix per shard; query batches are cut to fit.
        ntotal / dim: Required when ``vectors`` is a callable.
    """

    def __init__(self, vectors: np.ndarray | Any, *, metric: Metric = "ip", devices: Sequence[str] = ("cpu",),
                 fp16: bool = True, chunk_mb: int = 1024, ntotal: int | None = None, dim: int | None = None) -> None:
        import torch

        self._torch = torch
        if metric not in ("ip", "l2"):
            raise TorchSearchError(f"metric must be 'ip' or 'l2', got {metric!r}")
        if not devices:
            raise TorchSearchError("at least one device is needed")
        if callable(vectors):
            if ntotal is None or dim is None:
                raise TorchSearchError("ntotal and dim are needed when vectors is a callable")
            rows_of = vectors
        else:
            array = np.asarray(vectors)
            if array.ndim != 2:
                raise TorchSearchError(f"vectors must be 2-D, got shape {array.shape}")
            ntotal, dim = array.shape

            def rows_of(start: int, stop: int) -> np.ndarray:
                return array[start:stop]

        self.metric = metric
        self.ntotal = int(ntotal)
        self.d = int(dim)
        self.devices = [str(d) for d in devices]
        self.dtype = torch.float16 if fp16 else torch.float32
        self.chunk_bytes = max(1, chunk_mb) << 20
        bounds = np.linspace(0, self.ntotal, len(self.devices) + 1).astype(np.int64)
        self._shards = [self._build_shard(rows_of, int(lo), int(hi), dev)
                        for lo, hi, dev in zip(bounds[:-1], bounds[1:], self.devices, strict=True)]
        logger.info("torch flat %s index: %d x %d as %s on %s", metric, self.ntotal, self.d,
                    str(self.dtype).removeprefix("torch."), ", ".join(self.devices))

    def _build_shard(self, rows_of: Any, lo: int, hi: int, device: str) -> _Shard:
        torch = self._torch
        vectors = torch.empty((hi - lo, self.d), dtype=self.dtype, device=device)
        norms = torch.empty((hi - lo,), dtype=torch.float32, device=device) if self.metric == "l2" else None
        for start in range(lo, hi, _ROWS_PER_COPY):
            stop = min(hi, start + _ROWS_PER_COPY)
            part = torch.from_numpy(np.ascontiguousarray(rows_of(start, stop), dtype=np.float32)).to(device)
            vectors[start - lo : stop - lo] = part.to(self.dtype)
            if norms is not None:  # norms of the stored (possibly rounded) vectors, so scores match the storage
                norms[start - lo : stop - lo] = vectors[start - lo : stop - lo].float().pow(2).sum(1)
        return _Shard(vectors, norms, lo)

    def _chunk_rows(self, shard_rows: int) -> int:
        return max(1, self.chunk_bytes // max(1, shard_rows * 4))

    def _search_shard(self, shard: _Shard, queries: Any, k: int) -> tuple[Any, Any]:
        """Best ``k`` (scores, global ids) of one shard for a query chunk, as float32 / int64 on the host."""
        torch = self._torch
        q = queries.to(shard.vectors.device)
        scores = (q.to(self.dtype) @ shard.vectors.T).float()
        k = min(k, shard.rows)
        if self.metric == "ip":
            top, idx = torch.topk(scores, k, dim=1, largest=True, sorted=True)
        else:  # |q|^2 + |x|^2 - 2 q.x, computed in float32
            assert shard.norms is not None  # every L2 shard keeps its norms
            dist = q.float().pow(2).sum(1, keepdim=True) + shard.norms.unsqueeze(0) - 2 * scores
            top, idx = torch.topk(dist, k, dim=1, largest=False, sorted=True)
        return top.cpu(), idx.cpu() + shard.offset

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)``, each ``(len(queries), k)``, best first; ids are -1 past the index's size."""
        torch = self._torch
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.d:
            raise TorchSearchError(f"queries must be (n, {self.d}), got {queries.shape}")
        n = queries.shape[0]
        kk = max(1, min(k, self.ntotal))
        out_scores = np.empty((n, k), dtype=np.float32)
        out_ids = np.full((n, k), -1, dtype=np.int64)
        out_scores.fill(-np.finfo(np.float32).max if self.metric == "ip" else np.finfo(np.float32).max)
        step = min(self._chunk_rows(s.rows) for s in self._shards)
        host = torch.from_numpy(queries)
        with torch.inference_mode():
            for start in range(0, n, step):
                chunk = host[start : start + step]
                parts = [self._search_shard(s, chunk, kk) for s in self._shards if s.rows]
                scores = torch.cat([p[0] for p in parts], dim=1)
                ids = torch.cat([p[1] for p in parts], dim=1)
                if len(parts) > 1:  # merge the shards' candidates
                    scores, pos = torch.topk(scores, kk, dim=1, largest=self.metric == "ip", sorted=True)
                    ids = torch.gather(ids, 1, pos)
                out_scores[start : start + len(chunk), :kk] = scores.numpy()
                out_ids[start : start + len(chunk), :kk] = ids.numpy()
        return out_scores, out_ids


def from_faiss(index: Any, metric: Metric, devices: Sequence[str], *, fp16: bool = True,
               chunk_mb: int = 1024) -> TorchFlatIndex:
    """A ``TorchFlatIndex`` holding the vectors of a FAISS flat index, copied slice by slice."""
    if not hasattr(index, "reconstruct_n"):
        raise TorchSearchError(f"{type(index).__name__} cannot hand out its vectors")
    return TorchFlatIndex(lambda lo, hi: index.reconstruct_n(lo, hi - lo), metric=metric, devices=devices,
                          fp16=fp16, chunk_mb=chunk_mb, ntotal=int(index.ntotal), dim=int(index.d))
