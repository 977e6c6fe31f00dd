"""Resolving a path an agent gave against its work dir, refusing anything that lands outside."""

from __future__ import annotations

import os
from pathlib import Path

from rllm.errors import PathOutsideWorkDirError

__all__ = ["PathOutsideWorkDirError", "resolve_inside"]


def resolve_inside(work_dir: Path, path: str) -> Path:
    """``path`` (relative to ``work_dir``, or absolute) resolved with symlinks, if inside ``work_dir``.

    Raises ``PathOutsideWorkDirError`` with a message the agent can act on otherwise.
    """
    root = Path(os.path.realpath(work_dir))
    raw = Path(os.path.expanduser(path.strip())) if path.strip() else Path(".")
    candidate = Path(os.path.realpath(raw if raw.is_absolute() else root / raw))
    if candidate != root and root not in candidate.parents:
        raise PathOutsideWorkDirError(
            f"access denied: {path!r} is outside the work directory {root}; only files in the work "
            "directory can be read (use a path relative to it)")
    return candidate
