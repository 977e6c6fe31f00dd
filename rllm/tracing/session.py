"""``session``: group model calls into one rollout, built on ``contextvars``.

``with session(name="q7", task_id=7):`` (or ``async with``) makes a session current for the code
inside, including tasks it creates and threads started by ``asyncio.to_thread``; ``bind`` and
``ContextThreadPoolExecutor`` carry it into ``loop.run_in_executor`` and thread pools, which do
not copy the context themselves. Sessions nest: a child records its parent's id.

Only the opaque session id travels with requests (in the ``x-rllm-session`` header, see
``rllm.tracing.client``); the name and metadata stay in this process, and in the trace store when a
``store`` is given.

Depends on the standard library only, so the proxy's environment can import the header names.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from rllm.tracing.store import TraceStore

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-rllm-session"
NO_SESSION = "no-session"
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class SessionContext:
    """The current session: its id (sent with requests), and its local-only name, parent and metadata."""

    id: str
    name: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


_current: contextvars.ContextVar[SessionContext | None] = contextvars.ContextVar("rllm_session", default=None)


def is_valid_session_id(value: str) -> bool:
    """Session ids are 1-128 characters of ``[A-Za-z0-9._:-]``, starting with a letter or digit."""
    return bool(_SESSION_ID.match(value))


def current_session() -> SessionContext | None:
    """The innermost open session in this context, or ``None``."""
    return _current.get()


class session:  # noqa: N801 - used like a function: ``with session(...)``
    """Open a session for the calls made inside it; usable with ``with`` and ``async with``.

    Args:
        name: A label kept locally (and in ``store``); never sent.
        session_id: Use this id instead of a fresh random one (``[A-Za-z0-9._:-]``, at most 128).
        store: Record the session's name, parent and metadata there on entry.
        **metadata: Task data and anything else kept locally with the session; never sent.
    """

    def __init__(self, name: str | None = None, *, session_id: str | None = None,
                 store: TraceStore | None = None, **metadata: Any) -> None:
        if session_id is not None and not is_valid_session_id(session_id):
            raise ValueError(f"invalid session id {session_id!r}: use 1-128 characters of [A-Za-z0-9._:-]")
        self._id = session_id
        self._name = name
        self._store = store
        self._metadata = metadata
        self._token: contextvars.Token[SessionContext | None] | None = None
        self.context: SessionContext | None = None

    def __enter__(self) -> SessionContext:
        if self._token is not None:
            raise RuntimeError("a session object can be entered only once at a time")
        parent = _current.get()
        ctx = SessionContext(id=self._id or uuid.uuid4().hex, name=self._name,
                             parent_id=parent.id if parent else None, metadata=dict(self._metadata))
        if self._store is not None:
            self._store.record_session(ctx.id, name=ctx.name, parent_id=ctx.parent_id, metadata=ctx.metadata)
        self._token = _current.set(ctx)
        self.context = ctx
        return ctx

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    async def __aenter__(self) -> SessionContext:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


def bind(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``fn`` to run in a copy of the current context (session included), wherever it is called.

    Use it for ``loop.run_in_executor(None, bind(work))`` or ``executor.submit(bind(work))``;
    ``asyncio.to_thread`` copies the context already.
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.run(fn, *args, **kwargs)

    return run


class ContextThreadPoolExecutor(concurrent.futures.ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose tasks run in the submitter's context, so the session follows them."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[R]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)
