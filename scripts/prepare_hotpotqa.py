"""Fetch HotpotQA (distractor) and write it as JSONL (original schema) and as verl parquet.

    python scripts/prepare_hotpotqa.py [--out-dir data/hotpotqa] [--train-limit N] [--val-limit N]
    python scripts/prepare_hotpotqa.py --from-jsonl rllm/data/hotpotqa/dev_sample100.jsonl --val-size 20

Downloads ``hotpotqa/hotpot_qa`` (config ``distractor``) with ``datasets`` and writes, per split
(``train``, ``validation``):

* ``<split>.jsonl``: the original HotpotQA schema, which ``rllm.data.load_hotpotqa(path)`` reads;
* ``<split>.parquet``: verl rows (``prompt`` as system + user messages, ``data_source``,
  ``reward_model.ground_truth``, ``extra_info``, ``agent_name``) for
  ``examples/strands/config/strands_hotpotqa_rloo.yaml``.

It also writes ``corpus.jsonl``, the distinct context paragraphs of both splits as ``{id, title,
text}``, for a retrieval index that covers every question:
``python -m rag.build_index --corpus data/hotpotqa/corpus.jsonl --out data/hotpotqa/index``.

``--from-jsonl`` works offline from a file in the original schema (the shipped 100-question
sample, say): its last ``--val-size`` questions become the validation split, the rest train.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from rllm.agents.search import search_verl_rows
from rllm.data import hf_to_hotpotqa, hotpotqa_paragraphs, load_hotpotqa
from rllm.data.verl_rows import write_parquet

logger = logging.getLogger("prepare_hotpotqa")

HF_DATASET = "hotpotqa/hotpot_qa"
HF_CONFIG = "distractor"
SPLITS = ("train", "validation")


def fetch_split(split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """One split from the Hugging Face hub, as rows in the original HotpotQA schema."""
    from datasets import load_dataset

    hf_split = split if limit is None else f"{split}[:{limit}]"
    try:
        dataset = load_dataset(HF_DATASET, HF_CONFIG, split=hf_split)
    except Exception as error:  # noqa: BLE001 - any failure to fetch becomes one clear message
        raise SystemExit(
            f"could not fetch {HF_DATASET} ({HF_CONFIG}, {split}) from the Hugging Face hub: "
            f"{type(error).__name__}: {error}\n"
            "Offline? Build the parquet files from a local file in the original schema instead:\n"
            "  python scripts/prepare_hotpotqa.py --from-jsonl rllm/data/hotpotqa/dev_sample100.jsonl"
        ) from error
    return [hf_to_hotpotqa(row) for row in dataset]


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    """Rows as JSON lines (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_split(split: str, raw_rows: list[dict[str, Any]], out_dir: Path, agent_name: str) -> dict[str, Any]:
    """Write ``<split>.jsonl`` and ``<split>.parquet``; the parquet rows come from reading the JSONL back."""
    jsonl = write_jsonl(raw_rows, out_dir / f"{split}.jsonl")
    tasks = load_hotpotqa(jsonl)
    parquet = write_parquet(search_verl_rows(tasks, split, agent_name=agent_name), out_dir / f"{split}.parquet")
    logger.info("%s: %d questions -> %s, %s", split, len(tasks), jsonl, parquet)
    return {"split": split, "questions": len(tasks), "jsonl": str(jsonl), "parquet": str(parquet)}


def write_corpus(jsonl_files: list[Path], out_dir: Path) -> dict[str, Any]:
    """``corpus.jsonl``: the distinct ``{id, title, text}`` paragraphs of the given HotpotQA files."""
    seen: set[tuple[str, str]] = set()
    paragraphs = []
    for path in jsonl_files:
        for paragraph in hotpotqa_paragraphs(path):
            if (paragraph["title"], paragraph["text"]) not in seen:
                seen.add((paragraph["title"], paragraph["text"]))
                paragraphs.append({**paragraph, "id": str(len(paragraphs))})
    corpus = write_jsonl(paragraphs, out_dir / "corpus.jsonl")
    logger.info("corpus: %d paragraphs -> %s", len(paragraphs), corpus)
    return {"split": "corpus", "paragraphs": len(paragraphs), "jsonl": str(corpus)}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(f"--from-jsonl: no such file: {path}")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("data/hotpotqa"), help="where the files go")
    parser.add_argument("--from-jsonl", type=Path, help="build from this original-schema file instead of downloading")
    parser.add_argument("--val-size", type=int, default=10, help="with --from-jsonl: questions held out for validation")
    parser.add_argument("--train-limit", type=int, help="keep the first N training questions")
    parser.add_argument("--val-limit", type=int, help="keep the first N validation questions")
    parser.add_argument("--agent-name", default="strands_agent", help="agent loop that runs the rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Write both splits and the corpus; one summary per file written."""
    args = parse_args(argv)
    limits = {"train": args.train_limit, "validation": args.val_limit}
    if args.from_jsonl is not None:
        rows = _read_jsonl(args.from_jsonl)
        if not 0 < args.val_size < len(rows):
            raise SystemExit(f"--val-size must be between 1 and {len(rows) - 1} for {len(rows)} questions")
        splits = {"train": rows[: len(rows) - args.val_size], "validation": rows[len(rows) - args.val_size :]}
    else:
        splits = {split: fetch_split(split, limits[split]) for split in SPLITS}
    written = [write_split(split, rows[: limits[split]], args.out_dir, args.agent_name)
               for split, rows in splits.items()]
    return [*written, write_corpus([Path(w["jsonl"]) for w in written], args.out_dir)]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for summary in main():
        print(json.dumps(summary), file=sys.stdout)
