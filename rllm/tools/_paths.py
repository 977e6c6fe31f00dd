"""Opening a path an agent gave inside its work dir, with no window between the check and the open.

Resolving a path and then opening it leaves a window: a directory on the path swapped for a
symlink in between (``python_exec`` can do that in the same work dir, concurrently) makes the open
land outside. Here each component is opened with ``O_NOFOLLOW`` relative to the descriptor of the
directory before it, starting from the work dir's own descriptor, and ``..`` goes back to a
descriptor already held, never through the file system; the descriptor that comes back is what
the caller reads from. A symlink is read and its target walked the same way, so links that stay
inside the work dir work and a link that leads out is refused, whenever it appears. Above the work
dir nothing is opened: a ``..`` that leaves it may only come back in by the work dir's own name, as
``os.path.realpath`` would read it (``../work/x``); an absolute path is taken the same way.

Not covered: a directory already entered being moved out of the work dir by someone who can write
outside it, and hard links to outside files planted by such a one (the sandboxed ``python_exec``
can do neither).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rllm.errors import PathOutsideWorkDirError

__all__ = ["InsidePath", "open_inside"]

_MAX_LINKS = 40  # as Linux's MAXSYMLINKS
# O_NONBLOCK: opening a named pipe planted in the work dir must not block the agent.
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class InsidePath:
    """An open descriptor of a file or directory inside the work dir.

    Attributes:
        fd: The descriptor (closed when ``open_inside`` exits); read and stat through it only.
        relative: Where it was found, relative to the work dir, links resolved (``.`` for the work dir).
        root: The work dir's real path, for messages.
    """

    fd: int
    relative: PurePosixPath
    root: str


class _Walk:
    """One walk from the work dir's descriptor; holds a descriptor for each directory entered."""

    def __init__(self, work_dir: Path, shown: str) -> None:
        self.given = PurePosixPath(os.path.abspath(work_dir))
        self.root = os.path.realpath(work_dir)
        self.root_names = PurePosixPath(self.root).parts[1:]
        self.shown = shown
        self.root_fd = os.open(work_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.entered: list[tuple[str, int]] = []  # (name, descriptor) below the root, outermost first
        self.above = 0  # how many levels above the root the path has gone (nothing is opened there)

    def close(self) -> None:
        for _name, fd in self.entered:
            os.close(fd)
        self.entered.clear()
        os.close(self.root_fd)

    def _outside(self) -> PathOutsideWorkDirError:
        return PathOutsideWorkDirError(
            f"access denied: {self.shown!r} is outside the work directory {self.root}; only files in the work "
            "directory can be read (use a path relative to it)")

    def _missing(self) -> FileNotFoundError:
        return FileNotFoundError(f"no such file: {self.shown!r} (relative to the work directory {self.root})")

    def _restart(self, absolute: str) -> list[str]:
        """Back to the root for an absolute path; the names still to walk from there."""
        for _name, fd in self.entered:
            os.close(fd)
        self.entered.clear()
        parts = PurePosixPath(absolute).parts[1:]
        given = self.given.parts[1:]
        if parts[:len(given)] == given:  # the work dir as the caller spelled it
            self.above = 0
            return list(parts[len(given):])
        self.above = len(self.root_names)  # at "/": only the real path of the work dir leads back in
        return list(parts)

    def _step(self, name: str) -> list[str]:
        """Take one name; returns names to walk before the rest (a symlink's target), else ``[]``."""
        if name in ("", "."):
            return []
        if name == "..":
            if self.entered:
                os.close(self.entered.pop()[1])
            else:
                self.above = min(self.above + 1, len(self.root_names))
            return []
        if self.above:
            if name != self.root_names[len(self.root_names) - self.above]:
                raise self._outside()
            self.above -= 1
            return []
        parent = self.entered[-1][1] if self.entered else self.root_fd
        try:
            fd = os.open(name, _FLAGS, dir_fd=parent)
        except OSError as error:
            try:
                target = os.readlink(name, dir_fd=parent)
            except OSError:
                if error.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise self._missing() from None
                raise error from None
            return self._restart(target) if target.startswith("/") else target.split("/")
        self.entered.append((name, fd))
        return []

    def run(self, path: str) -> InsidePath:
        raw = os.path.expanduser(path.strip()) or "."
        pending = self._restart(raw) if raw.startswith("/") else raw.split("/")
        pending.reverse()
        links = 0
        while pending:
            more = self._step(pending.pop())
            if more:
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(f"too many levels of symbolic links in {self.shown!r}")
                pending.extend(reversed(more))
        if self.above:
            raise self._outside()
        fd = self.entered[-1][1] if self.entered else self.root_fd
        return InsidePath(fd, PurePosixPath(*(name for name, _fd in self.entered)), self.root)


@contextlib.contextmanager
def open_inside(work_dir: Path, path: str) -> Iterator[InsidePath]:
    """``path`` (relative to ``work_dir``, or absolute) opened inside ``work_dir``, as the module docstring says.

    Raises ``PathOutsideWorkDirError`` (a ``PermissionError``) when it leads outside,
    ``FileNotFoundError`` when it does not exist, and ``OSError`` for a symlink loop or an
    unreadable component.
    """
    walk = _Walk(work_dir, path)
    try:
        yield walk.run(path)
    finally:
        walk.close()
