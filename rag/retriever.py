"""Encoder + index + corpus: the synchronous search a server batch (or a benchmark) runs."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rag.corpus import Corpus
from rag.encoder import Encoder
from rag.index import IndexOptions, SearchIndex, load_index
from rag.manifest import Manifest

logger = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_workers(device: str) -> int:
    """Search threads by default: two on a CPU with two or more cores, one on a GPU.

    On CPU two single-threaded forwards beat one two-threaded forward (see rag/README.md); on a GPU
    its kernels queue anyway.
    """
    return min(2, available_cpus()) if device == "cpu" else 1


# Most queries per encoder forward on CPU, MiniLM on 2 cores: with the traced encoder 16 beat 32 and 8 at
# batches of 64 and 256 (in-process, 1.08-1.09x over 32), and 8, 24 and 32 once forwards were cut by token
# length; eager, 32 was the fastest of 16/32/64/whole batch.
CPU_QUERY_BATCH_SIZE = 16
CPU_QUERY_BATCH_SIZE_EAGER = 32


class Retriever:
    """Answers batches of queries with ``{id, title, contents, content, score}`` passages, best first.

    Safe to call from ``workers`` threads at once (the server's batcher does).
    """

    def __init__(self, encoder: Encoder, index: SearchIndex, corpus: Corpus, manifest: Manifest, *,
                 split_threads: bool = True) -> None:
        if index.ntotal != len(corpus):
            raise ValueError(f"index holds {index.ntotal} vectors but the corpus has {len(corpus)} passages")
        self.encoder = encoder
        self.index = index
        self.corpus = corpus
        self.manifest = manifest
        self._cpus = available_cpus()
        self._split_threads = split_threads and encoder.replicas > 1 and encoder.device == "cpu"
        self._active = 0
        self._active_lock = threading.Lock()

    @contextmanager
    def _threads_for_this_search(self) -> Iterator[None]:
        """With several workers, split the CPU threads between the searches running now.

        A search alone gets every thread; two at once get half each. torch's and OpenMP's thread
        counts set here apply to the calling thread only. Off when ``threads`` was given or on GPU.
        """
        if not self._split_threads:
            yield
            return
        with self._active_lock:
            self._active += 1
            share = max(1, self._cpus // self._active)
        try:
            self.encoder.set_threads(share)
            self.index.set_threads(share)
            yield
        finally:
            with self._active_lock:
                self._active -= 1

    @property
    def workers(self) -> int:
        """Threads that may call ``search`` at once without waiting for each other."""
        return self.encoder.replicas

    @classmethod
    def load(cls, index_dir: str | Path, options: IndexOptions | None = None, *, device: str | None = None,
             threads: int | None = None, mmap_index: bool = False,
             query_batch_size: int | None | Literal["auto"] = "auto",
             workers: int | Literal["auto"] = 1, trace_encoder: bool | None = None) -> Retriever:
        """Open an index directory written by ``rag.build_index`` or ``scripts/download_search_data.py``.

        ``query_batch_size`` is the encoder's (see ``Encoder``); ``"auto"`` takes
        ``CPU_QUERY_BATCH_SIZE`` on CPU (``CPU_QUERY_BATCH_SIZE_EAGER`` where the encoder runs
        eager) and one forward per batch on a GPU. ``workers`` is how many
        threads may search at once (encoder replicas sharing one set of weights); ``"auto"`` takes
        ``default_workers``. With more than one on CPU and no ``threads``, each search takes its share
        of the CPU threads: all of them alone, half with another running. ``trace_encoder`` is the
        encoder's ``trace`` (None: a TorchScript forward on CPU, eager on a GPU).
        """
        index_dir = Path(index_dir)
        manifest = Manifest.load(index_dir)
        options = options or IndexOptions()
        if threads and not options.threads:
            options.threads = threads
        corpus = Corpus(manifest.path(index_dir, manifest.corpus_file), manifest.path(index_dir, manifest.offsets_file))
        index = load_index(manifest.path(index_dir, manifest.index_file), manifest.index_type, manifest.metric,
                           options, mmap=mmap_index)
        encoder_device = device or ("cuda" if index.devices[0].startswith("cuda") else "cpu")
        if workers == "auto":
            workers = default_workers(encoder_device)
        encoder = Encoder.from_manifest(manifest, index_dir, device=encoder_device, fp16=options.fp16, threads=threads,
                                        query_batch_size=(None if isinstance(query_batch_size, str)
                                                          else query_batch_size),
                                        replicas=workers, trace=trace_encoder)
        if query_batch_size == "auto" and encoder.device == "cpu":
            encoder.query_batch_size = CPU_QUERY_BATCH_SIZE if encoder.traced else CPU_QUERY_BATCH_SIZE_EAGER
        if encoder.dim != manifest.dim:
            raise ValueError(f"encoder {manifest.encoder} gives {encoder.dim}-d vectors; the index has {manifest.dim}")
        logger.info("loaded %d passages from %s (encoder %s on %s, %s, %s queries per forward, %d worker(s), "
                    "index %s)", len(corpus), index_dir, manifest.encoder, encoder.device,
                    "traced" if encoder.traced else "eager", encoder.query_batch_size or "all", workers,
                    index.describe())
        return cls(encoder, index, corpus, manifest, split_threads=not threads)

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Top-``top_k`` passages for each query (``Corpus.result`` and the score)."""
        if not queries:
            return []
        scores, ids = self.encode_and_search(queries, top_k)
        return [[{**self.corpus.result(int(i)), "score": float(s)} for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]

    def encode_and_search(self, queries: list[str], top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` of the top-``top_k`` passages per query, without reading the corpus."""
        with self._threads_for_this_search():
            return self.index.search(self.encoder.encode_queries(queries), top_k)

    def describe(self) -> dict[str, Any]:
        """For ``/health``."""
        m = self.manifest
        return {
            "corpus_size": len(self.corpus),
            "index": self.index.describe(),
            "encoder": {"name": m.encoder, "device": self.encoder.device, "dim": m.dim, "normalize": m.normalize,
                        "query_prefix": m.query_prefix, "max_seq_length": self.encoder.max_seq_length,
                        "query_batch_size": self.encoder.query_batch_size, "traced": self.encoder.traced},
            "workers": self.workers,
        }
