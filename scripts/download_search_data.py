"""Fetch the standard Search-R1 retrieval data: the wiki-18 corpus and its e5-base-v2 flat index.

Writes an index directory ``rag.server`` serves as is:

    OUT/wiki-18.jsonl            21M passages {id, contents} ('"Title"\\ntext'), ~14 GB
    OUT/wiki-18.offsets.npy      8 bytes per passage, for memory-mapped access
    OUT/e5_Flat.index            FAISS IndexFlatIP, 768-d, ~65 GB (part_aa + part_ab joined)
    OUT/manifest.json            encoder intfloat/e5-base-v2, prefixes "query: " / "passage: "

    python scripts/download_search_data.py --out data/wiki18-e5
    bash rag/launch_rag.sh data/wiki18-e5 8000 --device gpu      # sharded over all GPUs, fp16

Sources (Hugging Face datasets): PeterJinGo/wiki-18-corpus (wiki-18.jsonl.gz) and
PeterJinGo/wiki-18-e5-index (part_aa, part_ab). Needs network access to huggingface.co and about
90 GB free while it runs; every step is skipped when its output is already there.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import shutil
import sys
from pathlib import Path

logger = logging.getLogger("download_search_data")

CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_FILE = "wiki-18.jsonl.gz"
INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
INDEX_PARTS = ("part_aa", "part_ab")
ENCODER = "intfloat/e5-base-v2"
DIM = 768
_NEEDED_GB = 90


class DownloadError(RuntimeError):
    """A download step failed; the message says what to do."""


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:
        raise DownloadError("huggingface_hub is not installed: pip install huggingface_hub") from e
    return huggingface_hub


def _fetch(repo: str, filename: str, out: Path) -> Path:
    """Download one file of a dataset repo into ``out`` (resumes partial downloads)."""
    hub = _hub()
    try:
        return Path(hub.hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset", local_dir=out))
    except Exception as e:  # noqa: BLE001 - hub, HTTP and OS errors all end here with one explanation
        raise DownloadError(
            f"could not download {filename} from https://huggingface.co/datasets/{repo}: {type(e).__name__}: {e}\n"
            "This needs network access to huggingface.co (set HF_ENDPOINT for a mirror). On an offline machine, "
            "run this script where there is network and copy the output directory over."
        ) from e


def _check_reachable() -> None:
    """Fail in seconds, not after a long timeout, when the hub cannot be reached."""
    hub = _hub()
    try:
        hub.HfApi().dataset_info(CORPUS_REPO, timeout=15)
    except Exception as e:  # noqa: BLE001
        raise DownloadError(f"cannot reach the Hugging Face hub ({type(e).__name__}: {e}). This script needs "
                            "network access; offline, serve the HotpotQA demo with `bash rag/launch_rag.sh`.") from e


def _check_space(out: Path) -> None:
    free_gb = shutil.disk_usage(out).free / 1e9
    if free_gb < _NEEDED_GB:
        logger.warning("only %.0f GB free in %s; the download needs about %d GB while it runs", free_gb, out,
                       _NEEDED_GB)


def fetch_corpus(out: Path) -> Path:
    """``OUT/wiki-18.jsonl``, downloaded and unpacked (the .gz is deleted afterwards)."""
    target = out / "wiki-18.jsonl"
    if target.is_file():
        logger.info("corpus already at %s", target)
        return target
    gz = _fetch(CORPUS_REPO, CORPUS_FILE, out)
    logger.info("unpacking %s", gz)
    tmp = target.with_suffix(".jsonl.tmp")
    with gzip.open(gz, "rb") as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, length=16 << 20)
    tmp.replace(target)
    gz.unlink()
    return target


def fetch_index(out: Path, keep_parts: bool = False) -> Path:
    """``OUT/e5_Flat.index``: the two parts downloaded and joined (each part deleted once appended)."""
    target = out / "e5_Flat.index"
    if target.is_file():
        logger.info("index already at %s", target)
        return target
    parts = [_fetch(INDEX_REPO, name, out) for name in INDEX_PARTS]
    tmp = target.with_suffix(".index.tmp")
    logger.info("joining %s into %s", ", ".join(p.name for p in parts), target)
    with tmp.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, dst, length=64 << 20)
            if not keep_parts:
                part.unlink()
    tmp.replace(target)
    return target


def write_manifest(out: Path, corpus: Path, index: Path) -> None:
    """Count passages (building the offsets file), check the index header, and write ``manifest.json``."""
    import faiss

    from rag.corpus import Corpus
    from rag.manifest import Manifest

    logger.info("indexing passage offsets of %s", corpus)
    offsets = out / "wiki-18.offsets.npy"
    n = len(Corpus(corpus, offsets))
    header = faiss.read_index(str(index), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if header.ntotal != n or header.d != DIM:
        raise DownloadError(f"{index} holds {header.ntotal} {header.d}-d vectors but {corpus} has {n} passages "
                            f"(expected {DIM}-d); delete the mismatched file and rerun")
    Manifest(encoder=ENCODER, query_prefix="query: ", passage_prefix="passage: ", normalize=True, dim=DIM,
             doc_count=n, index_type="flat", metric="ip", index_file=index.name, corpus_file=corpus.name,
             offsets_file=offsets.name).save(out)
    logger.info("wrote %s: %d passages, encoder %s", out / "manifest.json", n, ENCODER)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/wiki18-e5", help="index directory to write (data/ is git-ignored)")
    p.add_argument("--corpus-only", action="store_true", help="fetch the corpus, not the 65 GB index")
    p.add_argument("--keep-parts", action="store_true", help="keep part_aa/part_ab after joining them")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        need_network = not (out / "wiki-18.jsonl").is_file() or (
            not args.corpus_only and not (out / "e5_Flat.index").is_file())
        if need_network:
            _check_reachable()
            _check_space(out)
        corpus = fetch_corpus(out)
        if args.corpus_only:
            return 0
        write_manifest(out, corpus, fetch_index(out, keep_parts=args.keep_parts))
    except DownloadError as e:
        logger.error("%s", e)
        return 1
    print(f"ready: bash rag/launch_rag.sh {out} 8000 --device gpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
