"""The trace store: nothing lost under concurrent writers, errors surface, sessions read in call order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from rllm.errors import InfrastructureError, StoreWriteError
from rllm.tracing.store import TraceStore


def _trace(session_id: str, seq: int, **extra: object) -> dict:
    return {"trace_id": f"{session_id}-{seq}", "session_id": session_id, "seq": seq,
            "request": {"messages": [{"role": "user", "content": "x" * 200}]}, **extra}


def test_concurrent_writers_with_a_tiny_queue_lose_nothing(tmp_path: Path) -> None:
    writers, per_writer = 16, 400
    store = TraceStore(tmp_path / "t.db", queue_size=8, batch_size=64)

    def write(w: int) -> None:
        for seq in range(per_writer):
            store.put(_trace(f"s{w}", seq))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.flush(timeout=60)
    assert store.count() == writers * per_writer
    for w in range(writers):
        assert [t["seq"] for t in store.get_session(f"s{w}")] == list(range(per_writer))
    # A second reader (as in another process) sees the same committed data.
    with TraceStore(tmp_path / "t.db") as reader:
        assert reader.count() == writers * per_writer
        assert {s.session_id: s.num_traces for s in reader.sessions()} == {f"s{w}": per_writer for w in range(writers)}
    store.close()


async def test_async_writers_wait_for_commit(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db", queue_size=4)
    await asyncio.gather(*(store.aput(_trace(f"a{i % 8}", i // 8)) for i in range(400)))
    # aput(wait=True) returned, so every trace is readable without a flush.
    assert store.count() == 400
    assert [t["seq"] for t in store.get_session("a3")] == list(range(50))
    store.close()


def test_sessions_read_in_call_order_and_retried_writes_do_not_duplicate(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.db") as store:
        for seq in (2, 0, 3, 1):
            store.put(_trace("s", seq))
        store.put(_trace("s", 1))  # same trace_id again: ignored
        store.flush()
        assert [t["seq"] for t in store.get_session("s")] == [0, 1, 2, 3]
        assert store.max_seq("s") == 3 and store.max_seq("unknown") == -1
        assert store.get_session("unknown") == []


def test_session_rows_keep_local_metadata(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.db") as store:
        store.record_session("child", name="q7", parent_id="parent", metadata={"answer": "Paris"})
        store.put(_trace("child", 0))
        store.put(_trace("other", 0))
        store.flush()
        info = store.session_info("child")
        assert (info.name, info.parent_id, info.metadata, info.num_traces) == ("q7", "parent", {"answer": "Paris"}, 1)
        assert [s.session_id for s in store.sessions()] == ["child", "other"]


def test_a_write_error_is_retried_then_surfaces(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TraceStore(path, busy_timeout=0.05, max_retries=3, retry_delay=0.01)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database for longer than all retries
    future = store.put(_trace("s", 0))
    with pytest.raises(StoreWriteError, match="failed") as raised:
        future.result(timeout=30)
    # Not the policy's doing: a rollout whose traces could not be stored is retried and masked, never scored.
    assert isinstance(raised.value, InfrastructureError)
    with pytest.raises(StoreWriteError):
        store.flush(timeout=30)
    blocker.execute("ROLLBACK")
    blocker.close()
    # Retried once the lock is gone: the same trace goes in, and the store keeps working.
    store.put(_trace("s", 0)).result(timeout=30)
    store.flush(timeout=30)
    assert [t["seq"] for t in store.get_session("s")] == [0]
    store.close()


def test_a_transient_lock_is_retried_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TraceStore(path, busy_timeout=0.02, max_retries=8, retry_delay=0.02)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    futures = [store.put(_trace("s", i)) for i in range(50)]
    time.sleep(0.1)
    blocker.execute("ROLLBACK")
    blocker.close()
    for f in futures:
        f.result(timeout=30)
    assert store.count() == 50
    store.close()


def test_malformed_traces_fail_at_put(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.db") as store:
        with pytest.raises(KeyError):
            store.put({"session_id": "s", "seq": 0})
        with pytest.raises(TypeError):
            store.put({"trace_id": "x", "session_id": "s", "seq": 0, "bad": object()})
