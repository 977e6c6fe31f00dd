"""``file_read`` opens what it checked: races, links, pipes and what a listing shows.

``python_exec`` writes into the same work dir while the agent runs (Strands runs a turn's tool
calls concurrently), and ``file_read`` runs in the agent's own process with its credentials, so
whatever a model can plant or swap in its work dir must not lead ``file_read`` outside it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm.errors import PathOutsideWorkDirError, RLLMError
from rllm.tools import make_file_read_tool, read_file_text, run_python
from rllm.tools.python_exec import sandbox_problem

CANARY = "canary-outside-the-work-dir-5d1e"
_RACE_SECONDS = 3.0


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """``tmp_path/work`` (the work dir, with ``d/notes.txt`` and ``f.txt``) beside ``tmp_path/outside``."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "d").mkdir(parents=True)
    (work / "d" / "notes.txt").write_text("inside notes")
    (work / "f.txt").write_text("inside file")
    outside.mkdir()
    (outside / "notes.txt").write_text(CANARY)
    (outside / f"{CANARY}.txt").write_text(CANARY)
    return work


class _Flipper:
    """Swaps ``name`` in the work dir for a symlink to ``target`` and back, as fast as it can, in a thread."""

    def __init__(self, work: Path, name: str, target: Path) -> None:
        self.path, self.parked, self.target = work / name, work / f"{name}.parked", target
        self.flips = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.path.rename(self.parked)
            self.path.symlink_to(self.target)
            self.path.unlink()
            self.parked.rename(self.path)
            self.flips += 1

    def __enter__(self) -> _Flipper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize(("path", "name", "outside", "inside"), [
    ("d/notes.txt", "d", "outside", "inside notes"),          # a directory on the path swapped for a link
    ("d", "d", "outside", "directory d (1 entries):"),          # the directory listed
    ("f.txt", "f.txt", "outside/notes.txt", "inside file"),     # the file itself swapped for a link
])
def test_a_path_swapped_for_a_symlink_while_reading_never_leads_outside(
    layout: Path, path: str, name: str, outside: str, inside: str
) -> None:
    file_read = make_file_read_tool(layout)
    outcomes: dict[str, int] = {}
    with _Flipper(layout, name, layout.parent / outside) as flipper:
        deadline = time.monotonic() + _RACE_SECONDS
        while time.monotonic() < deadline:
            result = file_read(path=path)
            assert CANARY not in result, f"file_read returned a file outside the work dir after {flipper.flips} flips"
            kind = "inside" if result.startswith(inside) else result[:30]
            outcomes[kind] = outcomes.get(kind, 0) + 1
    assert flipper.flips > 100 and outcomes.get("inside", 0) > 0, outcomes  # it really raced, and reads got through
    assert sorted(p.name for p in layout.parent.iterdir()) == ["outside", "work"]


# Model code in python_exec (the real sandbox where it runs here) swaps which directory is called
# ``x``: ``xa/l -> ../..`` leads to the work dir's parent, ``xb/l -> ..`` to the work dir itself.
_FLIP_IN_PYTHON_EXEC = r'''
import os, time
os.makedirs('p/xa'); os.symlink('../..', 'p/xa/l'); os.rename('p/xa', 'xa')
os.makedirs('xb'); os.symlink('..', 'xb/l')
open('secret.txt', 'w').write('inside secret')
flips, end = 0, time.time() + SECONDS
while time.time() < end:
    os.rename('xa', 'x'); os.rename('x', 'xa'); os.rename('xb', 'x'); os.rename('x', 'xb')
    flips += 1
print(flips)
'''


async def test_links_swapped_by_code_in_python_exec_never_lead_file_read_outside(layout: Path) -> None:
    (layout.parent / "secret.txt").write_text(CANARY)
    sandbox = "bwrap" if sandbox_problem() is None else "guard"
    code = _FLIP_IN_PYTHON_EXEC.replace("SECONDS", str(_RACE_SECONDS))
    flipping = asyncio.create_task(run_python(code, layout, timeout=_RACE_SECONDS + 15, sandbox=sandbox))
    file_read = make_file_read_tool(layout)

    def read_while_flipping() -> list[str]:
        results: list[str] = []
        deadline = time.monotonic() + _RACE_SECONDS + 10
        while not (layout / "xb").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        while not flipping.done() and time.monotonic() < deadline:
            results.append(file_read(path="x/l/secret.txt"))
        return results

    results = await asyncio.to_thread(read_while_flipping)
    flipped = await flipping
    leaked = [r for r in results if CANARY in r]
    assert not leaked, f"file_read returned the file outside the work dir {len(leaked)} times of {len(results)}"
    assert flipped.startswith("exit code 0") and int(flipped.split()[-1]) > 100, flipped
    assert "inside secret" in results  # reads got through while it flipped


def test_symlinks_that_stay_inside_are_followed_and_those_that_leave_are_refused(layout: Path) -> None:
    (layout / "alias.txt").symlink_to("d/notes.txt")
    (layout / "d" / "up").symlink_to("..")
    (layout / "absolute.txt").symlink_to(layout.resolve() / "f.txt")
    (layout / "chain.txt").symlink_to("alias.txt")
    (layout / "d" / "data.csv").write_text("a,b\n1,2\n")
    (layout / "table").symlink_to("d/data.csv")
    (layout / "out").symlink_to("../outside")
    (layout / "d" / "sneaky").symlink_to("up/../outside/notes.txt")
    (layout / "loop").symlink_to("loop")
    file_read = make_file_read_tool(layout)
    assert file_read(path="alias.txt") == file_read(path="chain.txt") == "inside notes"
    assert file_read(path="d/up/d/up/f.txt") == file_read(path="absolute.txt") == "inside file"
    assert file_read(path="table") == "CSV table: 1 data rows x 2 columns (first row is the header)\na | b\n1 | 2"
    assert file_read(path="../work/d/notes.txt") == "inside notes"  # out and back in, as realpath reads it
    for escaping in ("out/notes.txt", "d/sneaky", "out"):
        result = file_read(path=escaping)
        assert result.startswith("Error: access denied:") and "outside the work directory" in result, result
    assert "too many levels of symbolic links" in file_read(path="loop")
    with pytest.raises(PathOutsideWorkDirError) as refused:
        read_file_text(layout, "out/notes.txt")
    assert isinstance(refused.value, RLLMError) and isinstance(refused.value, PermissionError)


def test_a_listing_shows_links_as_links_not_what_they_point_to(layout: Path) -> None:
    (layout / "leak.txt").symlink_to(layout.parent / "outside" / "notes.txt")
    (layout / "alias.txt").symlink_to("d/notes.txt")
    listing = make_file_read_tool(layout)(path=".")
    assert f"  leak.txt -> {layout.parent / 'outside' / 'notes.txt'}" in listing.splitlines()
    assert "  alias.txt -> d/notes.txt" in listing.splitlines()
    assert f"{len(CANARY)} bytes" not in listing  # the outside file's size is not shown
    assert "  d/" in listing.splitlines() and "  f.txt  (11 bytes)" in listing.splitlines()


@pytest.fixture
def fifo(layout: Path) -> Iterator[Path]:
    path = layout / "pipe"
    os.mkfifo(path)
    yield path
    try:  # a reader still blocked in open() on today's code gets its EOF and ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_named_pipe_is_refused_instead_of_hanging_the_agent(layout: Path, fifo: Path) -> None:
    results: list[str] = []
    reader = threading.Thread(target=lambda: results.append(make_file_read_tool(layout)(path="pipe")), daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert results, "file_read blocked on a named pipe"
    assert results[0] == "Error: 'pipe' is not a regular file or a directory; file_read reads only those"
