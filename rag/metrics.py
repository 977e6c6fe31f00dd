"""Server counters for ``GET /metrics`` (requests, errors, batch sizes, latency percentiles) and ``GET /stats``."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from rag.batcher import Batcher


def _bucket(size: int) -> str:
    """Power-of-two histogram bucket: 1, 2-3, 4-7, ..."""
    if size <= 1:
        return "1"
    lo = 1 << (size.bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[rank]


@dataclass
class ServerMetrics:
    """Counts kept by the app; latencies are a window of the most recent successful requests."""

    window: int = 10_000
    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[int] = field(default_factory=Counter)
    batch_sizes: Counter[str] = field(default_factory=Counter)
    max_batch_seen: int = 0
    _latencies: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._latencies = deque(maxlen=self.window)

    def record_batch(self, size: int, _seconds: float) -> None:
        """Called by the batcher after each computed batch."""
        self.batch_sizes[_bucket(size)] += 1
        self.max_batch_seen = max(self.max_batch_seen, size)

    def record_latency(self, seconds: float) -> None:
        """Wall time of one successful request."""
        self._latencies.append(seconds)

    @staticmethod
    def batching_stats(batcher: Batcher) -> dict[str, Any]:
        """The ``/stats`` body: the batching counters of rLLM's retrieval server, under its names.

        ``total_queries`` counts the queries computed in batches (cache hits and joined duplicates are
        not); ``batch_timeout_ms`` is 0 because no batch waits for a window to fill.
        """
        s = batcher.stats
        return {
            "total_batches": s.batches,
            "total_queries": s.computed,
            "avg_batch_size": s.computed / s.batches if s.batches else 0.0,
            "avg_throughput_qps": s.computed / s.compute_seconds if s.compute_seconds > 0 else 0.0,
            "batch_timeout_ms": 0.0,
            "max_batch_size": batcher.max_batch_size,
        }

    def snapshot(self, batcher: Batcher) -> dict[str, Any]:
        """The ``/metrics`` body."""
        s = batcher.stats
        lat = sorted(self._latencies)
        looked_up = s.cache_hits + s.deduplicated + s.computed
        return {
            "requests": dict(self.requests),
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
            "queries": s.queries,
            "rejected_overload": s.rejected,
            "batches": {
                "count": s.batches,
                "failed": s.failed_batches,
                "histogram": dict(sorted(self.batch_sizes.items(), key=lambda kv: int(kv[0].split("-")[0]))),
                "mean_size": round(s.computed / s.batches, 2) if s.batches else 0.0,
                "max_size": self.max_batch_seen,
                "compute_seconds": round(s.compute_seconds, 3),
            },
            "latency_ms": {
                "count": len(lat),
                "p50": round(_percentile(lat, 50) * 1e3, 2),
                "p95": round(_percentile(lat, 95) * 1e3, 2),
                "p99": round(_percentile(lat, 99) * 1e3, 2),
            },
            "queue_depth": batcher.queue_depth,
            "computing": batcher.computing,
            "cache": {
                "hits": s.cache_hits,
                "deduplicated": s.deduplicated,
                "computed": s.computed,
                "hit_rate": round((s.cache_hits + s.deduplicated) / looked_up, 4) if looked_up else 0.0,
                "entries": batcher.cache_entries,
            },
        }
