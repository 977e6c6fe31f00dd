"""``TraceStore``: a lossless SQLite store of captured model calls, read back in call order.

One long-lived connection, owned by a writer thread, commits traces in batches (WAL mode, so
readers in this or other processes never block it). Nothing is dropped: a full queue makes
``put`` wait (backpressure), a failed batch is retried and then surfaces as ``StoreWriteError``
on the futures of its traces and on the next ``flush()``. Reads go through a separate
connection and return a session's traces ordered by their per-session sequence number.

This module depends on the standard library and ``rllm.errors`` (itself standard library only): it
also runs inside the LiteLLM proxy's own virtual environment (see ``rllm.tracing.proxy``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm.errors import StoreWriteError

logger = logging.getLogger(__name__)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS traces (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trace_id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        created_at REAL NOT NULL,
        data TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS traces_session_seq ON traces (session_id, seq)",
    """CREATE TABLE IF NOT EXISTS sessions (
        session_id TEXT PRIMARY KEY,
        name TEXT,
        parent_id TEXT,
        metadata TEXT NOT NULL,
        created_at REAL NOT NULL)""",
)


@dataclass(frozen=True)
class SessionSummary:
    """One session known to the store: its trace count and, when recorded, name and parent."""

    session_id: str
    num_traces: int
    name: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass
class _Write:
    """One queued write: a trace row or a session row, and the future resolved on commit."""

    kind: str
    row: tuple[Any, ...]
    future: concurrent.futures.Future[None]


_STOP = object()


def _trace_row(trace: dict[str, Any]) -> tuple[Any, ...]:
    """The ``traces`` row of a trace; raises ``KeyError``/``TypeError`` at once on a malformed trace."""
    return (str(trace["trace_id"]), str(trace["session_id"]), int(trace["seq"]),
            float(trace.get("created_at") or time.time()), json.dumps(trace, separators=(",", ":")))


def _connect(path: str, *, timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=timeout, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return conn


class TraceStore:
    """Write traces in batches from a background thread; read sessions in call order.

    Args:
        path: SQLite file; created with its schema when missing.
        queue_size: Traces that may wait for the writer; beyond it ``put`` blocks.
        batch_size: Most traces committed in one transaction.
        max_retries: Attempts per batch before its traces fail with ``StoreWriteError``.
        retry_delay: First back-off between attempts (doubles each time).
    """

    def __init__(self, path: str | Path, *, queue_size: int = 10_000, batch_size: int = 512,
                 max_retries: int = 5, retry_delay: float = 0.05, busy_timeout: float = 10.0) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._batch_size = batch_size
        self._max_retries = max_retries
        self._retry_delay = retry_delay
        self._busy_timeout = busy_timeout
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._pending_lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._closed = False
        self._reader = _connect(self.path, timeout=busy_timeout)
        self._reader_lock = threading.Lock()
        with self._reader_lock:
            for statement in _SCHEMA:
                self._reader.execute(statement)

    # ----------------------------------------------------------------- writes
    def put(self, trace: dict[str, Any]) -> concurrent.futures.Future[None]:
        """Queue one trace; blocks while the queue is full. The future resolves once committed.

        The trace needs ``trace_id``, ``session_id`` and ``seq``; a ``trace_id`` already stored is
        ignored, so a retried write never duplicates a trace.
        """
        return self._enqueue(_Write("trace", _trace_row(trace), concurrent.futures.Future()))

    async def aput(self, trace: dict[str, Any], *, wait: bool = True) -> None:
        """``put`` for event loops: waits for queue space off the loop and, with ``wait``, for the commit."""
        try:
            future = self.put_nowait(trace)
        except queue.Full:
            future = await asyncio.to_thread(self.put, trace)
        if wait:
            await asyncio.wrap_future(future)

    def put_nowait(self, trace: dict[str, Any]) -> concurrent.futures.Future[None]:
        """Queue one trace or raise ``queue.Full`` at once."""
        return self._enqueue(_Write("trace", _trace_row(trace), concurrent.futures.Future()), block=False)

    def record_session(self, session_id: str, *, name: str | None = None, parent_id: str | None = None,
                       metadata: dict[str, Any] | None = None) -> concurrent.futures.Future[None]:
        """Store a session's name, parent and metadata (kept local: they never travel with requests)."""
        row = (session_id, name, parent_id, json.dumps(metadata or {}, default=str), time.time())
        return self._enqueue(_Write("session", row, concurrent.futures.Future()))

    def _enqueue(self, write: _Write, block: bool = True) -> concurrent.futures.Future[None]:
        if self._closed:
            raise RuntimeError("TraceStore is closed")
        self._ensure_writer()
        with self._pending_lock:
            self._pending.add(write.future)
        write.future.add_done_callback(self._forget)
        try:
            self._queue.put(write, block=block)
        except queue.Full:
            with self._pending_lock:
                self._pending.discard(write.future)
            raise
        return write.future

    def _forget(self, future: concurrent.futures.Future[None]) -> None:
        with self._pending_lock:
            self._pending.discard(future)
        if future.exception() is not None:
            self._errors.append(future.exception())  # type: ignore[arg-type]

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is committed; raise ``StoreWriteError`` if any write failed."""
        with self._pending_lock:
            pending = list(self._pending)
        done, not_done = concurrent.futures.wait(pending, timeout=timeout)
        if not_done:
            raise TimeoutError(f"{len(not_done)} traces not committed after {timeout} s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise StoreWriteError(f"{len(errors)} writes failed; first: {errors[0]}") from errors[0]

    def close(self, timeout: float | None = 30.0) -> None:
        """Commit what is queued, stop the writer and close both connections."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout=timeout)
            if self._writer.is_alive():
                logger.error("trace store writer did not stop within %s s", timeout)
        with self._reader_lock:
            self._reader.close()

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_writer(self) -> None:
        if self._writer is not None:
            return
        with self._writer_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._run_writer, name="rllm-trace-writer", daemon=True)
                self._writer.start()

    def _run_writer(self) -> None:
        conn = _connect(self.path, timeout=self._busy_timeout)
        try:
            stop = False
            while not stop:
                batch: list[_Write] = []
                item = self._queue.get()
                while True:
                    if item is _STOP:
                        stop = True
                    else:
                        batch.append(item)
                    if stop or len(batch) >= self._batch_size:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    self._commit(conn, batch)
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[_Write]) -> None:
        """Write one batch in one transaction, retrying with back-off; resolve its futures."""
        traces = [w.row for w in batch if w.kind == "trace"]
        sessions = [w.row for w in batch if w.kind == "session"]
        delay = self._retry_delay
        for attempt in range(1, self._max_retries + 1):
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if traces:
                        conn.executemany("INSERT OR IGNORE INTO traces (trace_id, session_id, seq, created_at, data)"
                                         " VALUES (?, ?, ?, ?, ?)", traces)
                    if sessions:
                        conn.executemany("INSERT OR REPLACE INTO sessions (session_id, name, parent_id, metadata,"
                                         " created_at) VALUES (?, ?, ?, ?, ?)", sessions)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except Exception as error:  # sqlite3.Error, or anything else: never kill the writer
                if attempt == self._max_retries:
                    logger.error("trace store: %d writes failed after %d attempts: %s", len(batch), attempt, error)
                    failure = StoreWriteError(f"writing {len(batch)} traces to {self.path} failed: {error}")
                    for write in batch:
                        write.future.set_exception(failure)
                    return
                logger.warning("trace store: write attempt %d failed (%s); retrying in %.2f s", attempt, error, delay)
                time.sleep(delay)
                delay *= 2
            else:
                for write in batch:
                    write.future.set_result(None)
                return

    # ----------------------------------------------------------------- reads
    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._reader_lock:
            return self._reader.execute(sql, params).fetchall()

    def get_session(self, session_id: str) -> list[dict[str, Any]]:
        """The session's traces in call order (by sequence number, then arrival)."""
        rows = self._query("SELECT data FROM traces WHERE session_id = ? ORDER BY seq, id", (session_id,))
        return [json.loads(data) for (data,) in rows]

    def max_seq(self, session_id: str) -> int:
        """The highest sequence number stored for the session, or -1."""
        ((value,),) = self._query("SELECT MAX(seq) FROM traces WHERE session_id = ?", (session_id,))
        return -1 if value is None else int(value)

    def count(self) -> int:
        """Traces stored in total."""
        ((value,),) = self._query("SELECT COUNT(*) FROM traces")
        return int(value)

    def session_info(self, session_id: str) -> SessionSummary | None:
        """What ``record_session`` stored for the session, with its trace count; ``None`` if unknown."""
        rows = self._query("SELECT name, parent_id, metadata FROM sessions WHERE session_id = ?", (session_id,))
        ((num,),) = self._query("SELECT COUNT(*) FROM traces WHERE session_id = ?", (session_id,))
        if not rows and not num:
            return None
        name, parent, metadata = rows[0] if rows else (None, None, None)
        return SessionSummary(session_id, int(num), name, parent, json.loads(metadata) if metadata else None)

    def sessions(self) -> list[SessionSummary]:
        """Every session with traces or a recorded row, in order of first appearance."""
        counts = self._query("SELECT session_id, COUNT(*), MIN(id) FROM traces GROUP BY session_id ORDER BY MIN(id)")
        recorded = {sid: (name, parent, meta) for sid, name, parent, meta in self._query(
            "SELECT session_id, name, parent_id, metadata FROM sessions ORDER BY created_at")}
        out = []
        for sid, num, _first in counts:
            name, parent, meta = recorded.pop(sid, (None, None, None))
            out.append(SessionSummary(sid, int(num), name, parent, json.loads(meta) if meta else None))
        out.extend(SessionSummary(sid, 0, name, parent, json.loads(meta) if meta else None)
                   for sid, (name, parent, meta) in recorded.items())
        return out
