"""A JSONL corpus read on demand: the file and an int64 array of line offsets, both memory-mapped.

Holding 21M wiki-18 passages as Python dicts costs tens of GB; here a passage costs one 8-byte
offset (file-backed, paged in on use) and is parsed only when a search returns it. Rows are
``{id, contents}`` (wiki-18: the first line of ``contents`` is the quoted title) or
``{id, title, text}``; row ``i`` of the file is vector ``i`` of the index.
"""

from __future__ import annotations

import json
import logging
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_CHUNK = 64 << 20


def build_offsets(corpus_path: str | Path, out_path: str | Path | None = None) -> np.ndarray:
    """Scan ``corpus_path`` for non-blank lines; return (and optionally save) their start offsets.

    The array has one entry per passage plus the file size as a sentinel, so passage ``i`` is
    ``file[off[i]:off[i+1]]`` (any blank lines after it are JSON whitespace).
    """
    corpus_path = Path(corpus_path)
    size = corpus_path.stat().st_size
    starts: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    with corpus_path.open("rb") as f:
        pos = 0
        while chunk := f.read(_CHUNK):
            newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A)
            starts.append(newlines.astype(np.int64) + pos + 1)
            pos += len(chunk)
    line_starts = np.concatenate(starts)
    line_starts = line_starts[line_starts < size]
    keep = np.ones(len(line_starts), dtype=bool)
    if len(line_starts):
        # A JSON row starts with "{"; only lines starting with whitespace can be blank, so read just those.
        first = np.memmap(corpus_path, dtype=np.uint8, mode="r")[line_starts]
        ends = np.append(line_starts[1:], size)
        with corpus_path.open("rb") as f:
            for i in np.flatnonzero(np.isin(first, np.frombuffer(b" \t\r\n", dtype=np.uint8))):
                f.seek(int(line_starts[i]))
                keep[i] = bool(f.read(int(ends[i] - line_starts[i])).strip())
    offsets = np.append(line_starts[keep], size).astype(np.int64)
    if out_path is not None:
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp.npy")
        np.save(tmp, offsets)
        tmp.replace(out_path)
    return offsets


def to_passage(row: dict[str, Any], index: int) -> dict[str, str]:
    """Normalise one corpus row to ``{id, title, contents}``."""
    pid = str(row.get("id", index))
    if "text" in row:
        return {"id": pid, "title": str(row.get("title") or ""), "contents": str(row["text"])}
    if "contents" in row:
        contents = str(row["contents"])
        head, sep, rest = contents.partition("\n")
        if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
            return {"id": pid, "title": head[1:-1], "contents": rest}
        return {"id": pid, "title": str(row.get("title") or ""), "contents": contents}
    raise ValueError(f"corpus row {index} has neither 'contents' nor 'text' (keys: {sorted(row)})")


def passage_text(row: dict[str, Any], index: int) -> str:
    """The text that is encoded for a row: ``contents`` as is, or ``title`` + newline + ``text``."""
    if "contents" in row and "text" not in row:
        return str(row["contents"])
    p = to_passage(row, index)
    return f"{p['title']}\n{p['contents']}" if p["title"] else p["contents"]


def to_result(row: dict[str, Any], index: int) -> dict[str, str]:
    """One row as the server answers it: ``to_passage``'s ``{id, title, contents}`` plus ``content``.

    ``content`` is the passage's whole text as the corpus holds it (``passage_text``: wiki-18's
    ``contents`` with its quoted title line, byte for byte), under the name rLLM's retrieval server
    and its clients use, so a client written for that server reads the same text from this one.
    """
    return {**to_passage(row, index), "content": passage_text(row, index)}


class Corpus:
    """Random access to the passages of a JSONL file; safe to share between threads."""

    def __init__(self, path: str | Path, offsets_path: str | Path | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file not found: {self.path}")
        offsets_path = Path(offsets_path) if offsets_path else self.path.with_suffix(".offsets.npy")
        self._offsets = self._load_offsets(offsets_path)
        self._file = self.path.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self._offsets[-1] > 0 else None

    def _load_offsets(self, offsets_path: Path) -> np.ndarray:
        """Memory-map the offsets file, (re)building it when missing or stale."""
        stat = self.path.stat()
        if offsets_path.is_file() and offsets_path.stat().st_mtime >= stat.st_mtime:
            offsets = np.load(offsets_path, mmap_mode="r")
            if len(offsets) and int(offsets[-1]) == stat.st_size:
                return offsets
        logger.info("indexing line offsets of %s into %s", self.path, offsets_path)
        build_offsets(self.path, offsets_path)
        return np.load(offsets_path, mmap_mode="r")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def row(self, i: int) -> dict[str, Any]:
        """The parsed JSON object of passage ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"passage {i} out of range (corpus has {len(self)})")
        assert self._map is not None
        raw = self._map[int(self._offsets[i]) : int(self._offsets[i + 1])]
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.path}: passage {i} is not a JSON object: {e}") from e

    def __getitem__(self, i: int) -> dict[str, str]:
        """Passage ``i`` as ``{id, title, contents}``."""
        return to_passage(self.row(i), i)

    def result(self, i: int) -> dict[str, str]:
        """Passage ``i`` as the server answers it: ``{id, title, contents, content}`` (see ``to_result``)."""
        return to_result(self.row(i), i)

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Parsed rows ``start..stop`` in order."""
        for i in range(start, len(self) if stop is None else min(stop, len(self))):
            yield self.row(i)

    def close(self) -> None:
        """Release the file mapping."""
        if self._map is not None:
            self._map.close()
        self._file.close()


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSONL (one object per line, UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
