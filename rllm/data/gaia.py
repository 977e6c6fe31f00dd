"""GAIA tasks read from the layout of the ``gaia-benchmark/GAIA`` dataset repository.

``scripts/prepare_gaia.py`` downloads the repository into a data dir, which then holds
``2023/<split>/metadata.jsonl`` (one JSON object per task with ``task_id``, ``Question``,
``Level``, ``Final answer`` and ``file_name``) with each task's attachment beside it. The
repository's newer ``metadata.parquet`` is read when no ``metadata.jsonl`` is present.
``GAIA_DEMO_DIR`` holds a few tasks in that layout, written for rllm and shipped as package data,
on which the evaluation runs offline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GAIA_YEAR = "2023"
GAIA_SPLITS = ("validation", "test")
GAIA_LEVELS = (1, 2, 3)
_REQUIRED = ("task_id", "Question", "Level")

GAIA_DEMO_DIR = Path(__file__).resolve().parent / "gaia_demo"
"""Demo tasks in GAIA's layout (eight validation, one test), package data: found in a normal install as in a clone."""


def gaia_split_dir(data_dir: str | Path, split: str = "validation", year: str = GAIA_YEAR) -> Path:
    """The directory holding ``split``'s metadata.

    That is ``data_dir/<year>/<split>``, or ``data_dir`` itself when it already contains the metadata.
    """
    data_dir = Path(data_dir).expanduser()
    if any((data_dir / name).is_file() for name in ("metadata.jsonl", "metadata.parquet")):
        return data_dir.resolve()
    return (data_dir / year / split).resolve()


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{lineno}: not a JSON object: {error}") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield row


def _parquet_rows(path: Path) -> Iterable[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:  # pragma: no cover - pyarrow ships with the gaia extra (datasets)
        raise ImportError(f"reading {path} needs pyarrow (pip install 'rllm[gaia]')") from error
    return pq.read_table(path).to_pylist()


def read_gaia_metadata(split_dir: Path) -> list[dict[str, Any]]:
    """The raw metadata rows of one split directory, in file order."""
    jsonl, parquet = split_dir / "metadata.jsonl", split_dir / "metadata.parquet"
    if jsonl.is_file():
        return list(_jsonl_rows(jsonl))
    if parquet.is_file():
        return list(_parquet_rows(parquet))
    raise FileNotFoundError(
        f"no GAIA metadata in {split_dir} (expected metadata.jsonl); download the dataset with "
        "`python scripts/prepare_gaia.py --data-dir DIR` (needs a Hugging Face token with access to "
        "gaia-benchmark/GAIA) and pass that DIR as --data-dir")


def _level(value: Any, task_id: str) -> int:
    try:
        level = int(str(value).strip())
    except ValueError:
        raise ValueError(f"GAIA task {task_id}: Level {value!r} is not 1, 2 or 3") from None
    if level not in GAIA_LEVELS:
        raise ValueError(f"GAIA task {task_id}: Level {value!r} is not 1, 2 or 3")
    return level


def _task(row: dict[str, Any], split_dir: Path) -> dict[str, Any]:
    missing = [key for key in _REQUIRED if key not in row]
    if missing:
        raise ValueError(f"GAIA row {row.get('task_id', '?')} in {split_dir} lacks {missing}")
    task_id = str(row["task_id"])
    file_name = (row.get("file_name") or "").strip()
    file_path = None
    if file_name:
        path = (split_dir / file_name).resolve()
        if split_dir not in path.parents:
            raise ValueError(f"GAIA task {task_id}: file_name {file_name!r} points outside {split_dir}")
        if not path.is_file():
            raise FileNotFoundError(f"GAIA task {task_id}: attachment {path} is missing; rerun "
                                    "scripts/prepare_gaia.py to download the attachments")
        file_path = str(path)
    final_answer = row.get("Final answer")
    return {
        "id": task_id,
        "question": str(row["Question"]),
        "level": _level(row["Level"], task_id),
        "final_answer": None if final_answer is None else str(final_answer),
        "file_name": file_name or None,
        "file_path": file_path,
    }


def load_gaia(
    data_dir: str | Path,
    split: str = "validation",
    *,
    level: int | Iterable[int] | None = None,
    limit: int | None = None,
    year: str = GAIA_YEAR,
) -> list[dict[str, Any]]:
    """GAIA tasks as ``{id, question, level, final_answer, file_name, file_path}`` in file order.

    ``file_path`` is the attachment's absolute path, or ``None`` for a task without one; a task
    whose attachment is missing raises ``FileNotFoundError``. ``level`` keeps one level (or
    several); ``limit`` keeps the first N tasks after that filter. In the test split the final
    answers are hidden (``"?"``).
    """
    split_dir = gaia_split_dir(data_dir, split, year)
    levels = None if level is None else ({level} if isinstance(level, int) else set(level))
    if levels is not None and not levels <= set(GAIA_LEVELS):
        raise ValueError(f"GAIA levels are 1, 2 and 3, not {sorted(levels - set(GAIA_LEVELS))}")
    tasks: list[dict[str, Any]] = []
    for row in read_gaia_metadata(split_dir):
        if limit is not None and len(tasks) >= limit:
            break
        if levels is not None and _level(row.get("Level"), str(row.get("task_id", "?"))) not in levels:
            continue
        tasks.append(_task(row, split_dir))
    logger.debug("loaded %d GAIA tasks from %s", len(tasks), split_dir)
    return tasks
