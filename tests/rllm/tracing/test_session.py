"""Sessions follow the work (tasks, threads, executors) and the traced client sends only their id."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

import httpx
import pytest

from rllm.offline.scripted_server import ScriptedOpenAIServer
from rllm.tracing import (
    SESSION_HEADER,
    ContextThreadPoolExecutor,
    bind,
    current_session,
    get_chat_client,
    get_chat_client_async,
    session,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_nesting_records_the_parent_and_restores_it() -> None:
    assert current_session() is None
    with session("outer", task_id=3) as outer:
        assert current_session() is outer and outer.metadata == {"task_id": 3} and outer.parent_id is None
        with session("inner") as inner:
            assert current_session() is inner and inner.parent_id == outer.id and inner.id != outer.id
        assert current_session() is outer
    assert current_session() is None


def test_explicit_ids_are_validated() -> None:
    with session(session_id="rollout-7.a:1") as s:
        assert s.id == "rollout-7.a:1"
    with pytest.raises(ValueError, match="invalid session id"):
        session(session_id="has space")


async def test_concurrent_tasks_keep_their_own_sessions() -> None:
    async def rollout(i: int) -> tuple[str, str]:
        async with session(f"r{i}") as s:
            await asyncio.sleep(0.01 * (i % 3))
            inner = await asyncio.create_task(_current_id())
            return s.id, inner

    pairs = await asyncio.gather(*(rollout(i) for i in range(20)))
    assert all(a == b for a, b in pairs) and len({a for a, _ in pairs}) == 20


async def _current_id() -> str:
    ctx = current_session()
    assert ctx is not None
    return ctx.id


async def test_session_follows_work_into_threads_and_executors() -> None:
    loop = asyncio.get_running_loop()

    def current() -> str | None:
        ctx = current_session()
        return ctx.id if ctx else None

    async with session("threads") as s:
        assert await asyncio.to_thread(current) == s.id
        assert await loop.run_in_executor(None, bind(current)) == s.id
        with ContextThreadPoolExecutor(max_workers=2) as pool:
            assert pool.submit(current).result() == s.id
            assert list(pool.map(lambda _: current(), range(4))) == [s.id] * 4
        # A plain executor does not copy the context: that is what bind() is for.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as plain:
            assert plain.submit(current).result() is None


def _recording_client(cls: type, seen: list[httpx.Request]) -> Any:
    def record(response: httpx.Response) -> None:
        seen.append(response.request)

    async def arecord(response: httpx.Response) -> None:
        record(response)

    return cls(event_hooks={"response": [arecord if cls is httpx.AsyncClient else record]})


async def test_async_client_tags_each_request_with_the_current_session_only() -> None:
    seen: list[httpx.Request] = []
    with ScriptedOpenAIServer() as srv:
        client = get_chat_client_async(srv.base_url, "k", http_client=_recording_client(httpx.AsyncClient, seen))
        async with session("a", answer="SECRET-ANSWER") as a:
            await client.chat.completions.create(model="m", messages=MESSAGES)
            async with session("b") as b:
                stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                async for _ in stream:
                    pass
        await client.close()
    assert [r.headers.get(SESSION_HEADER) for r in seen] == [a.id, b.id]
    for request in seen:
        assert "SECRET" not in str(request.url) and "SECRET" not in str(dict(request.headers))
        assert "SECRET" not in request.content.decode()


def test_sync_client_in_a_thread_pool_and_without_a_session(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[httpx.Request] = []
    with ScriptedOpenAIServer() as srv:
        client = get_chat_client(srv.base_url, "k", http_client=_recording_client(httpx.Client, seen))
        with session("sync") as s, ContextThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda _: client.chat.completions.create(model="m", messages=MESSAGES), range(4)))
        with caplog.at_level(logging.WARNING, logger="rllm.tracing.client"):
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert [r.headers.get(SESSION_HEADER) for r in seen] == [s.id] * 4 + [None]
    assert "outside any rllm session" in caplog.text
