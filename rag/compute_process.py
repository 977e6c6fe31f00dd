"""Encode + search in a separate process, so the compute never waits for the event loop's GIL.

In one process the compute thread re-takes the GIL between torch and FAISS calls; while the event
loop is busy answering a burst of requests it waits up to the switch interval each time. A child
process has its own interpreter: it loads the index and the encoder itself (the parent holds
neither) and answers ``search`` calls over a pipe; the parent's batcher thread blocks on the pipe
without holding the GIL.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ComputeProcessError(RuntimeError):
    """The compute process failed a batch, failed to start, or is gone."""


def _child(conn: Connection, index_dir: str, options: Any, threads: int | None, mmap_index: bool,
           log_level: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop (it drains first)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[compute]: %(message)s")
    from rag.retriever import Retriever

    try:
        retriever = Retriever.load(index_dir, options, threads=threads, mmap_index=mmap_index)
        retriever.search(["warm-up query"], 1)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", retriever.describe()))
    while True:
        try:
            queries, top_k = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            conn.send(("ok", retriever.search(queries, top_k)))
        except Exception as e:  # noqa: BLE001 - one failed batch fails its waiters, the process lives on
            logger.exception("batch of %d failed", len(queries))
            conn.send(("error", f"{type(e).__name__}: {e}"))


class ProcessRetriever:
    """A ``Retriever`` living in a child process; ``search`` and ``describe`` as the app expects.

    ``search`` is called from the batcher's single worker thread; a lock keeps calls one at a time anyway.
    """

    def __init__(self, index_dir: str | Path, options: Any = None, *, threads: int | None = None,
                 mmap_index: bool = False, start_timeout: float = 600.0) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, name="rag-compute", daemon=True,
                                 args=(child_conn, str(index_dir), options, threads, mmap_index,
                                       logging.getLogger().getEffectiveLevel()))
        self._proc.start()
        child_conn.close()
        self._lock = threading.Lock()
        if not self._conn.poll(start_timeout):
            self.close()
            raise ComputeProcessError(f"compute process did not load {index_dir} in {start_timeout:.0f} s")
        status, payload = self._recv()
        if status != "ready":
            self.close()
            raise ComputeProcessError(f"compute process failed to load {index_dir}: {payload}")
        self._describe: dict[str, Any] = {**payload, "compute": f"process {self._proc.pid}"}

    def _recv(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise ComputeProcessError(f"compute process exited (code {self._proc.exitcode})") from None

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Top-``top_k`` passages for each query, computed in the child."""
        with self._lock:
            try:
                self._conn.send((queries, top_k))
            except (OSError, ValueError):
                raise ComputeProcessError(f"compute process exited (code {self._proc.exitcode})") from None
            status, payload = self._recv()
        if status != "ok":
            raise ComputeProcessError(payload)
        return payload

    def describe(self) -> dict[str, Any]:
        """The child's ``Retriever.describe()``, plus its pid."""
        return self._describe

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child (closing the pipe ends its loop)."""
        self._conn.close()
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
