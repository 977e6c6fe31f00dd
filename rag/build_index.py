"""Build an index directory: encode a JSONL corpus in resumable shards, write the FAISS index and its manifest.

    python -m rag.build_index --corpus wiki.jsonl --encoder intfloat/e5-base-v2 \
        --query-prefix "query: " --passage-prefix "passage: " --out data/wiki-e5
    python -m rag.build_index --demo --out .cache/rag/hotpotqa-minilm     # shipped HotpotQA paragraphs

Embeddings go to ``OUT/embeddings/part-NNNNN.npy`` one shard at a time, so an interrupted build
picks up at the first missing shard; they are deleted once the index is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rag.corpus import Corpus, passage_text, write_jsonl
from rag.encoder import MINILM, Encoder
from rag.index import new_index
from rag.manifest import IndexType, Manifest, Metric
from rllm.errors import SetupError

logger = logging.getLogger(__name__)

_SHARDS = "embeddings"
_BUILD_INFO = "build.json"


def _shard_path(out: Path, i: int) -> Path:
    return out / _SHARDS / f"part-{i:05d}.npy"


def _check_resume(out: Path, info: dict) -> None:
    """Refuse to mix shards made with other settings."""
    path = out / _SHARDS / _BUILD_INFO
    if path.is_file():
        old = json.loads(path.read_text())
        if old != info:
            changed = sorted(k for k in info if old.get(k) != info[k])
            raise ValueError(f"{path.parent} holds shards built with other settings ({', '.join(changed)}); "
                             "delete that directory or build into another --out")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info, indent=2))


def build_index(corpus_path: str | Path, out_dir: str | Path, *, encoder: str = MINILM, query_prefix: str = "",
                passage_prefix: str = "", normalize: bool = True, max_seq_length: int | None = None,
                index_type: IndexType = "flat", metric: Metric = "ip", nlist: int = 1024, hnsw_m: int = 32,
                batch_size: int = 64, shard_size: int = 50_000, limit: int | None = None, device: str | None = None,
                threads: int | None = None, keep_embeddings: bool = False, progress: bool = True,
                model: Encoder | None = None) -> Manifest:
    """Encode ``corpus_path`` into ``out_dir`` and return the written manifest.

    ``limit`` keeps the first N passages (copied to ``OUT/corpus.jsonl`` so rows match vectors);
    otherwise the manifest points at the corpus where it lies. ``model`` reuses a loaded encoder.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(corpus_path, out / "corpus.offsets.npy")
    n = len(corpus) if limit is None else min(limit, len(corpus))
    if n == 0:
        raise ValueError(f"corpus {corpus_path} has no passages")
    if n < len(corpus):
        rows = list(corpus.iter_rows(0, n))
        corpus.close()
        corpus = Corpus(write_jsonl(rows, out / "corpus.jsonl"), out / "corpus.offsets.npy")
    corpus_file = corpus.path.resolve()
    corpus_ref = corpus_file.name if corpus_file.parent == out.resolve() else str(corpus_file)

    enc = model or Encoder(encoder, query_prefix=query_prefix, passage_prefix=passage_prefix, normalize=normalize,
                           device=device, max_seq_length=max_seq_length, threads=threads)
    info = {"encoder": encoder, "passage_prefix": passage_prefix, "normalize": normalize,
            "max_seq_length": max_seq_length, "corpus": str(corpus_file), "passages": n, "shard_size": shard_size}
    _check_resume(out, info)

    shards = range(0, -(-n // shard_size))
    bar = tqdm(total=n, desc="encoding passages", unit="psg", disable=not progress)
    for s in shards:
        start, stop = s * shard_size, min((s + 1) * shard_size, n)
        path = _shard_path(out, s)
        if path.is_file():
            bar.update(stop - start)
            continue
        parts = []
        for b in range(start, stop, batch_size):
            texts = [passage_text(corpus.row(i), i) for i in range(b, min(b + batch_size, stop))]
            parts.append(enc.encode_passages(texts, batch_size=batch_size))
            bar.update(len(texts))
        tmp = path.with_name(path.stem + ".tmp.npy")
        np.save(tmp, np.concatenate(parts))
        tmp.replace(path)
    bar.close()

    index = new_index(index_type, enc.dim, metric, nlist=nlist, hnsw_m=hnsw_m)
    if index_type == "ivf":
        # A uniform sample, one shard in memory at a time (wiki-18's vectors alone are 64 GB).
        rng, fraction = np.random.default_rng(0), min(1.0, max(nlist * 64, 100_000) / n)
        sample = np.concatenate([shard[rng.random(len(shard)) < fraction]
                                 for shard in (np.load(_shard_path(out, s), mmap_mode="r") for s in shards)])
        if len(sample) < nlist:
            raise ValueError(f"IVF with nlist={nlist} needs at least {nlist} passages; the corpus has {n}")
        logger.info("training IVF%d on %d vectors", nlist, len(sample))
        index.train(sample)
    for s in tqdm(shards, desc="adding to index", disable=not progress):
        index.add(np.load(_shard_path(out, s)))
    import faiss

    manifest = Manifest(encoder=encoder, query_prefix=query_prefix, passage_prefix=passage_prefix,
                        normalize=normalize, dim=enc.dim, doc_count=n, index_type=index_type, metric=metric,
                        corpus_file=corpus_ref, max_seq_length=max_seq_length)
    tmp = out / (manifest.index_file + ".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(out / manifest.index_file)
    manifest.save(out)
    corpus.close()
    if not keep_embeddings:
        shutil.rmtree(out / _SHARDS, ignore_errors=True)
    logger.info("wrote %s index of %d passages to %s", index_type, n, out)
    return manifest


def build_demo_index(out_dir: str | Path, *, limit: int | None = None, max_seq_length: int | None = None,
                     progress: bool = True, model: Encoder | None = None) -> Manifest:
    """The embedded default: MiniLM over the HotpotQA paragraphs shipped with ``rllm`` (offline)."""
    from rllm.data.hotpotqa import hotpotqa_paragraphs

    out = Path(out_dir)
    paragraphs = hotpotqa_paragraphs()[:limit]
    write_jsonl(paragraphs, out / "corpus.jsonl")
    return build_index(out / "corpus.jsonl", out, encoder=MINILM, max_seq_length=max_seq_length, progress=progress,
                       model=model)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag.build_index", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="JSONL with {id, contents} or {id, title, text} rows")
    src.add_argument("--demo", action="store_true", help="use the HotpotQA paragraphs shipped with rllm")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--encoder", default=MINILM,
                   help=f"sentence-transformers model: hub name or folder (default {MINILM})")
    p.add_argument("--query-prefix", default="", help='e.g. "query: " for e5')
    p.add_argument("--passage-prefix", default="", help='e.g. "passage: " for e5')
    p.add_argument("--no-normalize", action="store_true", help="keep raw (unnormalised) embeddings")
    p.add_argument("--max-seq-length", type=int, default=None)
    p.add_argument("--index-type", choices=["flat", "ivf", "hnsw"], default="flat")
    p.add_argument("--metric", choices=["ip", "l2"], default="ip")
    p.add_argument("--nlist", type=int, default=1024, help="IVF lists")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW neighbours per node")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shard-size", type=int, default=50_000, help="passages per resumable embedding shard")
    p.add_argument("--limit", type=int, default=None, help="index only the first N passages")
    p.add_argument("--device", default=None, help="torch device for encoding (default: cuda if available)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--keep-embeddings", action="store_true", help="keep the embedding shards after the build")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 when the index is written, 2 with one line when the corpus or encoder cannot be had."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        _build(args)
    except SetupError as error:
        print(f"rag.build_index: error: {error}", file=sys.stderr)
        return 2
    return 0


def _build(args: argparse.Namespace) -> None:
    if args.corpus and not Path(args.corpus).is_file():
        raise SetupError(f"corpus {args.corpus} does not exist (write it first, e.g. "
                         f"python scripts/prepare_hotpotqa.py --out-dir data/hotpotqa, or use --demo)")
    if args.demo:
        build_demo_index(args.out, limit=args.limit)
        return
    build_index(args.corpus, args.out, encoder=args.encoder, query_prefix=args.query_prefix,
                passage_prefix=args.passage_prefix, normalize=not args.no_normalize,
                max_seq_length=args.max_seq_length, index_type=args.index_type, metric=args.metric, nlist=args.nlist,
                hnsw_m=args.hnsw_m, batch_size=args.batch_size, shard_size=args.shard_size, limit=args.limit,
                device=args.device, threads=args.threads, keep_embeddings=args.keep_embeddings)


if __name__ == "__main__":
    sys.exit(main())
