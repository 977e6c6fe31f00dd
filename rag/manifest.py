"""The manifest stored beside an index: which encoder made it and how to read the files.

The server reads the encoder, its prefixes and normalisation from here, so one server binary
serves an e5-base-v2 wiki-18 index and a MiniLM demo index alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

MANIFEST_NAME = "manifest.json"

IndexType = Literal["flat", "ivf", "hnsw"]
Metric = Literal["ip", "l2"]


class Manifest(BaseModel):
    """How an index directory was built.

    Attributes:
        encoder: sentence-transformers model (hub name or folder) (a relative path is taken from the index dir).
        query_prefix: Text put before every query, e.g. e5's ``"query: "``.
        passage_prefix: Text put before every passage when the index was built, e.g. ``"passage: "``.
        normalize: Whether embeddings are L2-normalised (inner product is then cosine).
        dim: Embedding dimension.
        doc_count: Passages in the corpus, equal to vectors in the index.
        index_type: What the index file holds: ``flat``, ``ivf`` or ``hnsw``.
        metric: ``ip`` (inner product) or ``l2``.
        index_file / corpus_file / offsets_file: File names inside the index directory (or absolute paths).
        max_seq_length: Token limit given to the encoder; None keeps the model's own.
    """

    format_version: int = 1
    encoder: str
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    dim: int = Field(gt=0)
    doc_count: int = Field(ge=0)
    index_type: IndexType = "flat"
    metric: Metric = "ip"
    index_file: str = "index.faiss"
    corpus_file: str = "corpus.jsonl"
    offsets_file: str = "corpus.offsets.npy"
    max_seq_length: int | None = None

    def path(self, index_dir: str | Path, name: str) -> Path:
        """Resolve one of the file names against the index directory."""
        p = Path(name)
        return p if p.is_absolute() else Path(index_dir) / p

    def save(self, index_dir: str | Path) -> Path:
        """Write ``manifest.json`` into ``index_dir``."""
        out = Path(index_dir) / MANIFEST_NAME
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(out)
        return out

    @classmethod
    def load(cls, index_dir: str | Path) -> Manifest:
        """Read ``manifest.json`` from ``index_dir``, naming the directory when it is missing."""
        path = Path(index_dir) / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {index_dir}: build one with `python -m rag.build_index` "
                                    "or fetch one with scripts/download_search_data.py")
        return cls.model_validate_json(path.read_text(encoding="utf-8"))
