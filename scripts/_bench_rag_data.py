"""bench_rag's corpus, queries and index: a synthetic HotpotQA corpus indexed once and cached, and distinct queries.

Private to ``scripts/bench_rag.py``, which puts the repository on ``sys.path`` before importing it.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rag.corpus import Corpus, write_jsonl
from rag.manifest import Manifest
from rllm.data.hotpotqa import SHIPPED_HOTPOTQA

logger = logging.getLogger("bench_rag")
# About 820k distinct one-span queries exist; past this many a query joins two spans (a far larger space).
_ONE_SPAN_QUERIES = 600_000
# Architectures for --random-encoder, as overrides of the MiniLM config (all-MiniLM-L6-v2 is the base;
# e5-base-v2 is BERT-base: 12 layers, 768 wide, same uncased WordPiece vocabulary).
ENCODER_SHAPES: dict[str, dict[str, Any]] = {
    "minilm": {},
    "e5-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}
E5_PREFIXES = ("query: ", "passage: ")


def _hotpotqa_text() -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(paragraph title, sentences) pairs and the questions of the shipped HotpotQA sample."""
    paragraphs, questions = [], []
    for line in SHIPPED_HOTPOTQA.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        questions.append(row["question"])
        for title, sentences in row["context"]:
            sentences = [s.strip() for s in sentences if s.strip()]
            if sentences:
                paragraphs.append((title, sentences))
    return paragraphs, questions


def _synthetic_passages(n: int, seed: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    """``n`` distinct (title, sentences) passages mixing HotpotQA sentences."""
    paragraphs, _ = _hotpotqa_text()
    pool = sorted({s for _, ss in paragraphs for s in ss})
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    out = []
    while len(out) < n:
        title, own = paragraphs[rng.randrange(len(paragraphs))]
        pair = (own[rng.randrange(len(own))], pool[rng.randrange(len(pool))])
        if pair not in seen:
            seen.add(pair)
            out.append((title, pair))
    return out


def random_encoder(shape: str, files: Path, cache_root: Path) -> Path:
    """A sentence-transformers folder with ``shape``'s architecture and random weights (seed 0).

    Tokenizer and sentence-transformers configs come from ``files`` (a MiniLM folder, weights not
    needed); the weights are drawn here, so only ~1 MB has to reach the machine. Encoding costs what
    the trained model costs (same tokenizer, same shapes); the embeddings mean nothing.
    """
    out = cache_root / f"encoder-random-{shape}"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModel

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(files, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
    config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
    config.update(ENCODER_SHAPES[shape])
    (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    pooling = tmp / "1_Pooling" / "config.json"
    if pooling.is_file():
        pool = json.loads(pooling.read_text(encoding="utf-8"))
        pool["word_embedding_dimension"] = config["hidden_size"]
        pooling.write_text(json.dumps(pool, indent=2), encoding="utf-8")
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(tmp)).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    logger.info("random-weight %s encoder (%d layers, %d wide) written to %s", shape, config["num_hidden_layers"],
                config["hidden_size"], out)
    return out


def build_bench_index(n: int, vectors: str, cache_root: Path, encoder: str | None = None,
                      prefixes: tuple[str, str] = ("", "")) -> Path:
    """The benchmark index directory for ``n`` passages (built once, then reused).

    ``encoder`` is a sentence-transformers name or folder (default: MiniLM); a non-default one gets
    its own cache folder, named after the folder.
    """
    from rag.encoder import MINILM

    tag = "" if encoder is None else f"{Path(encoder).name}-"
    encoder = encoder or MINILM
    query_prefix, passage_prefix = prefixes
    out = cache_root / f"bench-{vectors}-{tag}{n}"
    if (out / "manifest.json").is_file():
        m = Manifest.load(out)
        if m.doc_count == n and m.encoder == encoder:
            logger.info("reusing %s", out)
            return out
    passages = _synthetic_passages(n)
    rows = [{"id": str(i), "title": t, "text": " ".join(ss)} for i, (t, ss) in enumerate(passages)]
    write_jsonl(rows, out / "corpus.jsonl")
    from rag.build_index import build_index

    if vectors == "encode":
        build_index(out / "corpus.jsonl", out, encoder=encoder, query_prefix=query_prefix,
                    passage_prefix=passage_prefix, max_seq_length=128, batch_size=64)
        return out
    import faiss

    from rag.encoder import Encoder
    from rag.index import new_index

    encoder_model = Encoder(encoder, passage_prefix=passage_prefix, max_seq_length=128)
    sentences = sorted({s for _, ss in passages for s in ss})
    logger.info("encoding %d distinct sentences for %d passages", len(sentences), n)
    sent_vecs = encoder_model.encode_passages(sentences, batch_size=64)
    where = {s: i for i, s in enumerate(sentences)}
    index = new_index("flat", encoder_model.dim)
    for start in range(0, n, 50_000):
        chunk = passages[start : start + 50_000]
        vecs = sent_vecs[[where[ss[0]] for _, ss in chunk]] + sent_vecs[[where[ss[1]] for _, ss in chunk]]
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        index.add(vecs.astype(np.float32))
    faiss.write_index(index, str(out / "index.faiss"))
    Corpus(out / "corpus.jsonl", out / "corpus.offsets.npy").close()
    Manifest(encoder=encoder, query_prefix=query_prefix, passage_prefix=passage_prefix, dim=encoder_model.dim,
             doc_count=n, max_seq_length=128).save(out)
    return out


class QuerySource:
    """Search-like queries (6-14 word spans of HotpotQA text, and questions), never repeated across a run."""

    def __init__(self, seed: int = 1) -> None:
        paragraphs, questions = _hotpotqa_text()
        self._words = " ".join(s for _, ss in paragraphs for s in ss).split()
        self._questions = list(questions)
        self._rng = random.Random(seed)
        self._seen: set[str] = set()

    def take(self, n: int) -> list[str]:
        out = []
        while len(out) < n:
            if self._questions and self._rng.random() < 0.05:
                q = self._questions.pop()
            elif len(self._seen) < _ONE_SPAN_QUERIES:
                start = self._rng.randrange(len(self._words) - 16)
                q = " ".join(self._words[start : start + self._rng.randint(6, 14)])
            else:  # the one-span queries are running out (GPU runs draw millions): join two shorter spans
                a, b = self._rng.randrange(len(self._words) - 16), self._rng.randrange(len(self._words) - 16)
                words = self._words[a : a + self._rng.randint(4, 8)] + self._words[b : b + self._rng.randint(3, 6)]
                q = " ".join(words)
            if q not in self._seen:
                self._seen.add(q)
                out.append(q)
        return out


def measure_corpus_memory(index_dir: Path, sample: int = 20_000) -> dict[str, float]:
    """Python heap per passage: the memory-mapped ``Corpus`` (after reading every sampled passage) vs. dicts."""
    import tracemalloc

    m = Manifest.load(index_dir)
    tracemalloc.start()
    corpus = Corpus(m.path(index_dir, m.corpus_file), m.path(index_dir, m.offsets_file))
    n = min(sample, len(corpus))
    for i in range(n):
        corpus[i]
    mapped, _ = tracemalloc.get_traced_memory()
    as_dicts = [corpus[i] for i in range(n)]
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del as_dicts
    corpus.close()
    return {"passages": len(corpus), "offsets_bytes_per_passage": 8.0,
            "corpus_heap_bytes_total": mapped,
            "dict_heap_bytes_per_passage": round((held - mapped) / n, 1),
            "avg_passage_file_bytes": round(corpus.path.stat().st_size / len(corpus), 1)}
