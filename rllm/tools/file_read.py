"""A file-reading tool confined to one work directory.

Text files come back as text, CSV as a table with its shape, JSON pretty-printed, a directory as
a listing, and a binary file (spreadsheet, PDF, image, audio) as a note with its size and type so
the agent can turn to ``python_exec``. Long content is paged with ``offset``.

The path is opened component by component from the work dir's descriptor without following links
(``_paths.open_inside``), and everything shown is read or stat'ed through the descriptor that
walk opened: a path swapped for a symlink while it is read cannot lead outside. Symlinks that stay
inside the work dir are followed; one that leads out is refused. A listing shows a link as
``name -> target``. Anything but a regular file or a directory (a named pipe, say) is refused.
"""

from __future__ import annotations

import csv
import io
import json
import mimetypes
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from strands import tool

from rllm.tools._paths import InsidePath, open_inside

_SNIFF_BYTES = 8192
_MAX_FILE_BYTES = 50 * 1024 * 1024
_MAX_LISTING = 200
_TEXT_MIMES = ("application/json", "application/xml", "application/javascript", "application/x-sh")


def _looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        # A multi-byte character cut at the sniff boundary is still text.
        return error.start < len(head) - 4
    return False


def _describe_binary(path: PurePosixPath, size: int) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "unknown type"
    return (f"{path.name} is a binary file ({size:,} bytes, {mime}); it cannot be shown as text. "
            "Use python_exec to process it (for example with a library that reads this format).")


def _entry_line(entry: os.DirEntry[str], dir_fd: int) -> str:
    """One listing line, from the entry itself: a link is shown as a link, never as what it points to."""
    try:
        if entry.is_symlink():
            return f"  {entry.name} -> {os.readlink(entry.name, dir_fd=dir_fd)}"
        if entry.is_dir(follow_symlinks=False):
            return f"  {entry.name}/"
        return f"  {entry.name}  ({entry.stat(follow_symlinks=False).st_size:,} bytes)"
    except OSError:  # removed or replaced since the directory was read
        return f"  {entry.name}  (changed while listing)"


def _listing(directory: InsidePath) -> str:
    with os.scandir(directory.fd) as scan:
        entries = sorted(scan, key=lambda entry: entry.name)
    lines = [f"directory {directory.relative.as_posix()} ({len(entries)} entries):"]
    lines += [_entry_line(entry, directory.fd) for entry in entries[:_MAX_LISTING]]
    if len(entries) > _MAX_LISTING:
        lines.append(f"  ... {len(entries) - _MAX_LISTING} more")
    return "\n".join(lines)


def _render_csv(text: str, delimiter: str) -> str:
    rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    if not rows:
        return "(empty CSV file)"
    width = max(len(row) for row in rows)
    body = "\n".join(" | ".join(cell.strip() for cell in row) for row in rows)
    return f"CSV table: {len(rows) - 1} data rows x {width} columns (first row is the header)\n{body}"


def _render(path: PurePosixPath, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        try:
            return _render_csv(text, "\t" if suffix == ".tsv" else ",")
        except csv.Error as error:
            return f"(could not parse as CSV: {error}; raw text follows)\n{text}"
    if suffix in (".json", ".jsonld"):
        try:
            parsed: Any = json.loads(text)
        except json.JSONDecodeError as error:
            return f"(not valid JSON: {error}; raw text follows)\n{text}"
        return json.dumps(parsed, indent=2, ensure_ascii=False)
    return text


def _page(text: str, offset: int, max_chars: int) -> str:
    if offset >= len(text) and text:
        return f"(offset {offset} is past the end; the content has {len(text)} characters)"
    chunk = text[offset:offset + max_chars]
    end = offset + len(chunk)
    if offset == 0 and end >= len(text):
        return chunk
    note = f"[characters {offset}-{end} of {len(text)}"
    note += f"; call again with offset={end} for more]" if end < len(text) else "]"
    return f"{chunk}\n{note}"


def read_file_text(work_dir: Path, path: str, offset: int = 0, max_chars: int = 20_000) -> str:
    """What ``file_read`` shows for ``path``; raises ``PermissionError``/``OSError`` on failure.

    ``PathOutsideWorkDirError`` (a ``PermissionError``) when ``path`` leads outside ``work_dir``.
    """
    with open_inside(work_dir, path) as found:
        info = os.fstat(found.fd)
        if stat.S_ISDIR(info.st_mode):
            return _listing(found)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path!r} is not a regular file or a directory; file_read reads only those")
        with open(found.fd, "rb", closefd=False) as handle:
            head = handle.read(_SNIFF_BYTES)
            mime = mimetypes.guess_type(found.relative.name)[0] or ""
            textual_mime = mime.startswith("text/") or mime in _TEXT_MIMES
            if _looks_binary(head) and not textual_mime:
                return _describe_binary(found.relative, info.st_size)
            if info.st_size > _MAX_FILE_BYTES:
                raise OSError(f"{path!r} is {info.st_size:,} bytes, above the {_MAX_FILE_BYTES:,}-byte limit of "
                              "file_read; use python_exec to read parts of it")
            data = head + handle.read(_MAX_FILE_BYTES + 1 - len(head))
    if len(data) > _MAX_FILE_BYTES:
        raise OSError(f"{path!r} grew past the {_MAX_FILE_BYTES:,}-byte limit of file_read while it was read; "
                      "use python_exec to read parts of it")
    text = data.decode("utf-8", errors="replace")
    return _page(_render(found.relative, text), max(0, offset), max(1, max_chars))


def make_file_read_tool(work_dir: Path, *, max_chars: int = 20_000) -> Any:
    """A ``file_read`` Strands tool bound to ``work_dir``."""

    @tool(name="file_read")
    def file_read(path: str, offset: int = 0) -> str:
        """Read a file from the task's work directory (text, CSV, JSON; a binary file gets a size note).

        Args:
            path: Path relative to the work directory (or absolute inside it); "." lists the directory.
            offset: Character offset to start from, to page through long content.
        """
        try:
            return read_file_text(work_dir, path, offset, max_chars)
        except (OSError, ValueError) as error:
            return f"Error: {error}"

    return file_read
