"""Download the gated GAIA benchmark (``gaia-benchmark/GAIA``, 2023) with its attachments.

GAIA is gated on the Hugging Face Hub: accept its conditions on
https://huggingface.co/datasets/gaia-benchmark/GAIA while logged in, then pass a token with read
access (``HF_TOKEN``, or a prior ``hf auth login``; ``--token`` works too, with a warning that
``ps`` shows it). The files land in ``DATA_DIR/2023/<split>/``: the questions in
``metadata.jsonl`` (written from the repository's ``metadata.parquet`` when the repository has no
JSONL) and each attachment beside them, which is the layout ``rllm.data.gaia.load_gaia`` and
``examples/strands/eval_gaia.py --data-dir`` read.

    HF_TOKEN=hf_... python scripts/prepare_gaia.py --data-dir data/gaia    # validation and test
    python scripts/prepare_gaia.py --data-dir data/gaia --split validation  # with a saved `hf auth login`

Failures (no token, no access, no network) end with a message saying what to do, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rllm.data.gaia import load_gaia
from rllm.secret_options import add_secret_argument

logger = logging.getLogger("prepare_gaia")

REPO_ID = "gaia-benchmark/GAIA"
DATASET_URL = f"https://huggingface.co/datasets/{REPO_ID}"
YEAR = "2023"
SPLITS = ("validation", "test")


class PrepareError(Exception):
    """A failure with a message for the user; no traceback is shown."""


def resolve_token(cli_token: str | None) -> str | None:
    """``--token``, else ``HF_TOKEN``, else the token saved by ``hf auth login``."""
    if cli_token:
        return cli_token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    try:
        from huggingface_hub import get_token
    except ImportError:
        return None
    return get_token()


def download(data_dir: Path, splits: list[str], token: str, revision: str | None = None) -> Path:
    """``snapshot_download`` the splits' files into ``data_dir``; errors become ``PrepareError``."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as error:
        raise PrepareError("huggingface_hub is not installed: pip install 'rllm[gaia]'") from error
    patterns = [f"{YEAR}/{split}/*" for split in splits]
    logger.info("downloading %s (%s) into %s", REPO_ID, ", ".join(patterns), data_dir)
    try:
        path = snapshot_download(REPO_ID, repo_type="dataset", revision=revision, local_dir=data_dir,
                                 allow_patterns=patterns, token=token)
    except GatedRepoError as error:
        raise PrepareError(f"your token has no access to the gated dataset {REPO_ID}: open {DATASET_URL} while "
                           "logged in, accept its conditions, then run this again") from error
    except RevisionNotFoundError as error:
        raise PrepareError(f"revision {revision!r} does not exist in {REPO_ID}") from error
    except RepositoryNotFoundError as error:
        raise PrepareError(f"the Hub did not let this token see {REPO_ID}: check that the token is valid and "
                           f"that you accepted the dataset's conditions on {DATASET_URL}") from error
    except LocalEntryNotFoundError as error:
        raise PrepareError("cannot reach the Hugging Face Hub (offline, or HF_HUB_OFFLINE is set), and "
                           f"{data_dir} holds no previous download; run this on a machine with network access, "
                           "or copy a prepared data dir here") from error
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 401:
            raise PrepareError("the Hub rejected the token (HTTP 401): set a valid token in HF_TOKEN") from error
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PrepareError(f"the Hub answered with an error: {first_line}") from error
    except OSError as error:
        raise PrepareError(f"could not write to {data_dir}: {error}") from error
    return Path(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def finalize_split(split_dir: Path) -> Path:
    """Make sure ``split_dir/metadata.jsonl`` exists, writing it from ``metadata.parquet`` if needed."""
    jsonl = split_dir / "metadata.jsonl"
    if jsonl.is_file():
        return jsonl
    parquet = split_dir / "metadata.parquet"
    if not parquet.is_file():
        raise PrepareError(f"{split_dir} has neither metadata.jsonl nor metadata.parquet: the download is "
                           "incomplete or the repository layout changed")
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(_jsonable(row), ensure_ascii=False) + "\n")
    tmp.replace(jsonl)
    logger.info("wrote %s (%d tasks) from %s", jsonl, len(rows), parquet.name)
    return jsonl


def describe_split(data_dir: Path, split: str) -> str:
    """One line: tasks per level and attachments, after checking every attachment is present."""
    try:
        tasks = load_gaia(data_dir, split)
    except (FileNotFoundError, ValueError) as error:
        raise PrepareError(str(error)) from error
    levels = Counter(task["level"] for task in tasks)
    attachments = sum(task["file_path"] is not None for task in tasks)
    hidden = sum(task["final_answer"] in (None, "?") for task in tasks)
    per_level = ", ".join(f"level {level}: {levels[level]}" for level in sorted(levels))
    note = f"; answers hidden for {hidden}" if hidden else ""
    return f"{split}: {len(tasks)} tasks ({per_level}), {attachments} attachments{note}"


def main(argv: list[str] | None = None) -> int:
    """Download, normalise and check the requested splits; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("data/gaia"), help="where to put the dataset")
    parser.add_argument("--split", action="append", choices=SPLITS, help="split to fetch (repeatable; default: both)")
    add_secret_argument(parser, "--token", env="HF_TOKEN",
                        help="Hugging Face token with access to GAIA (without either: the saved `hf auth login`)")
    parser.add_argument("--revision", help="dataset revision (branch, tag or commit); default: main")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    for noisy in ("httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    splits = args.split or list(SPLITS)
    try:
        token = resolve_token(args.token)
        if not token:
            raise PrepareError(f"no Hugging Face token: {REPO_ID} is gated. Accept its conditions on {DATASET_URL}, "
                               "create a read token at https://huggingface.co/settings/tokens, and set it in "
                               "the HF_TOKEN environment variable")
        args.data_dir.mkdir(parents=True, exist_ok=True)
        root = download(args.data_dir, splits, token, args.revision)
        lines = []
        for split in splits:
            finalize_split(root / YEAR / split)
            lines.append(describe_split(root, split))
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(f"GAIA is ready in {root}; evaluate with: python examples/strands/eval_gaia.py --data-dir {args.data_dir} "
          "--base-url URL --model NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main())
