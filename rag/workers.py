"""Search in worker processes: encode + search off the server's GIL, the index shared through the page cache.

Threads that compute in the server process share its GIL with the event loop: every burst of
answers the loop sends stalls the encoder between torch ops (on 2 cores the compute ran ~30%
slower under an RL load than alone). ``ProcessRetriever`` runs ``workers`` child processes
instead, each with its own ``Retriever`` (the index file memory-mapped, so the vectors are held
once in the page cache however many processes read them), and hands each batch to a free one.
Each search takes its share of the CPU threads: all of them alone, half beside another.

    retriever = ProcessRetriever.start("data/my-index", workers=2)
    retriever.search(["who wrote Hamlet?"], 3)
    retriever.close()
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.index import IndexOptions
from rllm.errors import SearchWorkerError

logger = logging.getLogger(__name__)

_READY, _OK, _FAILED = "ready", "ok", "failed"


@dataclass
class _Child:
    number: int
    process: Any
    conn: Any
    threads: int | None = None
    busy: threading.Lock = field(default_factory=threading.Lock)


def _serve(conn: Any, index_dir: str, options: IndexOptions, query_batch_size: int | str | None,
           mmap_index: bool) -> None:
    """Child process: load the retriever, then answer ``(queries, top_k, threads)`` until ``None`` arrives."""
    import torch

    from rag.retriever import Retriever

    try:
        retriever = Retriever.load(index_dir, options, mmap_index=mmap_index, query_batch_size=query_batch_size)
        retriever.search(["warm-up query"], 1)
    except BaseException as error:  # noqa: BLE001 - the parent reports it as the start failure
        conn.send((_FAILED, f"{type(error).__name__}: {error}"))
        return
    conn.send((_READY, retriever.describe()))
    current = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if message is None:
            return
        queries, top_k, threads = message
        if threads != current:
            torch.set_num_threads(threads)
            retriever.index.set_threads(threads)
            current = threads
        try:
            conn.send((_OK, retriever.search(queries, top_k)))
        except Exception as error:  # noqa: BLE001 - one batch's failure, told to its waiters
            conn.send((_FAILED, f"{type(error).__name__}: {error}"))


class ProcessRetriever:
    """A ``RetrieverLike`` whose searches run in ``workers`` child processes (see the module docstring).

    ``search`` blocks the calling thread (without the GIL) until a child answers; call it from as
    many threads as there are workers, as the server's batcher does.
    """

    def __init__(self, children: list[_Child], description: dict[str, Any], cpus: int, start_args: tuple) -> None:
        self._children = children
        self._free: queue.SimpleQueue[_Child] = queue.SimpleQueue()
        for child in children:
            self._free.put(child)
        self._description = description
        self._cpus = cpus
        self._busy = 0
        self._lock = threading.Lock()
        self._start_args = start_args
        self._closed = False

    @classmethod
    def start(cls, index_dir: str | Path, options: IndexOptions | None = None, *, workers: int = 2,
              query_batch_size: int | str | None = "auto", mmap_index: bool = True,
              timeout: float = 600.0) -> ProcessRetriever:
        """Start ``workers`` children loading ``index_dir`` side by side; returns once all answer a query."""
        from rag.retriever import available_cpus

        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        args = (str(index_dir), options or IndexOptions(device="cpu"), query_batch_size, mmap_index)
        children = [cls._spawn(number, args) for number in range(workers)]
        description: dict[str, Any] = {}
        for child in children:
            description = cls._wait_ready(child, timeout, [c for c in children if c is not child])
        description["workers"] = workers
        description["compute"] = "processes"
        logger.info("%d search worker processes ready (%s)", workers, ", ".join(str(c.process.pid) for c in children))
        return cls(children, description, available_cpus(), args)

    @staticmethod
    def _spawn(number: int, args: tuple) -> _Child:
        parent, child = mp.get_context("spawn").Pipe()
        process = mp.get_context("spawn").Process(target=_serve, args=(child, *args), daemon=True,
                                                  name=f"rag-search-{number}")
        process.start()
        child.close()
        return _Child(number, process, parent)

    @staticmethod
    def _wait_ready(child: _Child, timeout: float, others: list[_Child]) -> dict[str, Any]:
        status, payload = _FAILED, f"did not load the index within {timeout:.0f} s"
        try:
            if child.conn.poll(timeout):
                status, payload = child.conn.recv()
        except EOFError:
            child.process.join(5)
            payload = f"exited with code {child.process.exitcode} while loading"
        if status != _READY:
            for c in [child, *others]:
                c.process.kill()
            raise SearchWorkerError(f"search worker {child.number} failed to start: {payload}")
        return payload

    @property
    def workers(self) -> int:
        """Searches that may run at once."""
        return len(self._children)

    def describe(self) -> dict[str, Any]:
        """For ``/health``: the children's retriever, plus ``workers`` and ``compute``."""
        return dict(self._description)

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Top-``top_k`` passages per query, computed by a free child with its share of the CPU threads."""
        if not queries:
            return []
        if self._closed:
            raise SearchWorkerError("the search workers are closed")
        child = self._free.get()
        with self._lock:
            self._busy += 1
            threads = max(1, self._cpus // self._busy)
        try:
            try:
                child.conn.send((queries, top_k, threads))
                status, payload = child.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = child.process.exitcode
                child = self._replace(child)
                raise SearchWorkerError(f"search worker {child.number} exited (code {code}) during a batch of "
                                        f"{len(queries)}; a new one was started") from None
            if status != _OK:
                raise SearchWorkerError(f"search worker {child.number} failed: {payload}")
            return payload
        finally:
            with self._lock:
                self._busy -= 1
            self._free.put(child)

    def _replace(self, dead: _Child) -> _Child:
        """A new child in the dead one's place (loaded before it takes work)."""
        dead.process.join(1)
        child = self._spawn(dead.number, self._start_args)
        self._wait_ready(child, 600.0, [])
        self._children[self._children.index(dead)] = child
        logger.warning("search worker %d exited; replaced by pid %d", dead.number, child.process.pid)
        return child

    def close(self, timeout: float = 10.0) -> None:
        """Stop the children (after the batcher drained); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for child in self._children:
            try:
                child.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for child in self._children:
            child.process.join(timeout)
            if child.process.is_alive():
                child.process.kill()
            child.conn.close()
