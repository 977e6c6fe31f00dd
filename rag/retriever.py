"""Encoder + index + corpus: the synchronous search a server batch (or a benchmark) runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from rag.corpus import Corpus
from rag.encoder import Encoder
from rag.index import IndexOptions, SearchIndex, load_index
from rag.manifest import Manifest

logger = logging.getLogger(__name__)

# Queries per encoder forward on CPU: 32 was the fastest of 16/32/64/whole batch for MiniLM on 2 cores.
CPU_QUERY_BATCH_SIZE = 32


class Retriever:
    """Answers batches of queries with ``{id, title, contents, score}`` passages, best first.

    Not async and not locked: the server calls it from one worker thread at a time.
    """

    def __init__(self, encoder: Encoder, index: SearchIndex, corpus: Corpus, manifest: Manifest) -> None:
        if index.ntotal != len(corpus):
            raise ValueError(f"index holds {index.ntotal} vectors but the corpus has {len(corpus)} passages")
        self.encoder = encoder
        self.index = index
        self.corpus = corpus
        self.manifest = manifest

    @classmethod
    def load(cls, index_dir: str | Path, options: IndexOptions | None = None, *, device: str | None = None,
             threads: int | None = None, mmap_index: bool = False,
             query_batch_size: int | None | Literal["auto"] = "auto") -> Retriever:
        """Open an index directory written by ``rag.build_index`` or ``scripts/download_search_data.py``.

        ``query_batch_size`` is the encoder's (see ``Encoder``); ``"auto"`` takes
        ``CPU_QUERY_BATCH_SIZE`` on CPU and one forward per batch on a GPU.
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
        if query_batch_size == "auto":
            query_batch_size = CPU_QUERY_BATCH_SIZE if encoder_device == "cpu" else None
        encoder = Encoder.from_manifest(manifest, index_dir, device=encoder_device, fp16=options.fp16, threads=threads,
                                        query_batch_size=query_batch_size)
        if encoder.dim != manifest.dim:
            raise ValueError(f"encoder {manifest.encoder} gives {encoder.dim}-d vectors; the index has {manifest.dim}")
        logger.info("loaded %d passages from %s (encoder %s on %s, %s queries per forward, index %s)", len(corpus),
                    index_dir, manifest.encoder, encoder.device, query_batch_size or "all", index.describe())
        return cls(encoder, index, corpus, manifest)

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Top-``top_k`` passages for each query."""
        if not queries:
            return []
        scores, ids = self.index.search(self.encoder.encode_queries(queries), top_k)
        return [[{**self.corpus[int(i)], "score": float(s)} for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, ids)]

    def describe(self) -> dict[str, Any]:
        """For ``/health``."""
        m = self.manifest
        return {
            "corpus_size": len(self.corpus),
            "index": self.index.describe(),
            "encoder": {"name": m.encoder, "device": self.encoder.device, "dim": m.dim, "normalize": m.normalize,
                        "query_prefix": m.query_prefix, "max_seq_length": self.encoder.max_seq_length,
                        "query_batch_size": self.encoder.query_batch_size},
        }
