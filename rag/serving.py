"""The HTTP layer under the retrieval app: granian (Rust) with its limits, or uvicorn as a fallback.

Granian holds the limits a hostile or broken client tests below the application:

- ``header_timeout``: a connection must deliver a complete request head within this many seconds,
  the first one and every later one on a keep-alive connection, so silent, half-sent and idle
  connections are closed (hyper's ``header_read_timeout``);
- ``max_header_bytes``: the HTTP/1 read buffer; a longer head is answered 431 and closed, so an
  unterminated 16 MB header line costs the server at most this much;
- ``max_connections``: connections served at once (granian's ``backpressure``); the excess is not
  accepted but waits in the kernel's listen backlog, holding no file descriptor and no memory of
  ours, and is served as slots free.

The body read timeout is the app's own (``rag.server.RetrievalApp``, 408), since no server offers one.
HTTP/2 is off: its header limits are separate and default to 16 MB.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Any, Literal

from rag.errors import HttpConfigError

logger = logging.getLogger(__name__)

HttpServer = Literal["granian", "uvicorn"]

# hyper refuses a read buffer below 8 KiB, and granian caps the header timeout at 60 s.
_MIN_HEADER_BYTES = 8192
_MAX_HEADER_TIMEOUT = 60.0


@dataclass(frozen=True)
class HttpLimits:
    """Limits enforced by the HTTP server itself (see the module docstring).

    Attributes:
        header_timeout: Seconds to receive a complete request head (also closes silent and idle connections).
        max_header_bytes: Largest request head, in bytes (431 above).
        max_connections: Connections served at once; the rest wait in the listen backlog.
        backlog: Listen backlog (connections the kernel holds beyond ``max_connections``).
    """

    header_timeout: float = 10.0
    max_header_bytes: int = 16384
    max_connections: int = 2048
    backlog: int = 4096

    def check(self) -> None:
        """Raise ``HttpConfigError`` for values the servers refuse or that disable a limit."""
        if not 0 < self.header_timeout <= _MAX_HEADER_TIMEOUT:
            raise HttpConfigError(f"header_timeout must be in (0, {_MAX_HEADER_TIMEOUT:.0f}] s, "
                                  f"got {self.header_timeout}")
        if self.max_header_bytes < _MIN_HEADER_BYTES:
            raise HttpConfigError(f"max_header_bytes must be at least {_MIN_HEADER_BYTES}, got {self.max_header_bytes}")
        if self.max_connections < 1 or self.backlog < 1:
            raise HttpConfigError("max_connections and backlog must be at least 1")


def granian_available() -> bool:
    """Whether granian can be imported (it is in the ``rag`` extra)."""
    try:
        import granian  # noqa: F401
    except ImportError:
        return False
    return True


def _granian_server(app: Any, host: str, port: int, limits: HttpLimits, *, log_level: str, access_log: bool) -> Any:
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server.embed import Server

    return Server(app, address=host, port=port, interface=Interfaces.ASGI, http=HTTPModes.http1, websockets=False,
                  backlog=max(128, limits.backlog), backpressure=limits.max_connections,
                  http1_settings=HTTP1Settings(header_read_timeout=max(1, round(limits.header_timeout * 1000)),
                                               max_buffer_size=limits.max_header_bytes),
                  log_level=LogLevels(log_level), log_access=access_log)


def _run_granian(app: Any, host: str, port: int, limits: HttpLimits, *, log_level: str, access_log: bool) -> None:
    """Serve in this process's event loop (granian's embedded server) until SIGINT/SIGTERM.

    Embedded, so the app object (and the index it holds) is served as loaded, without a worker
    process that would load it again. The ASGI lifespan shutdown drains the batcher.
    """

    async def serve() -> None:
        server = _granian_server(app, host, port, limits, log_level=log_level, access_log=access_log)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        logger.info("granian on http://%s:%d (header timeout %.1f s, max header %d B, max connections %d)",
                    host, port, limits.header_timeout, limits.max_header_bytes, limits.max_connections)
        await server.serve()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def uvicorn_options(limits: HttpLimits) -> dict[str, Any]:
    """The uvicorn settings closest to ``limits``: h11 (bounded heads), a connection cap, a keep-alive timeout.

    uvicorn answers connections past ``limit_concurrency`` with 503 and has no header read timeout:
    a connection that sends half a head stays open. Use it only where granian cannot be installed.
    """
    return {"http": "h11", "h11_max_incomplete_event_size": limits.max_header_bytes,
            "limit_concurrency": limits.max_connections, "timeout_keep_alive": max(1, int(limits.header_timeout)),
            "backlog": limits.backlog}


def serve(app: Any, host: str, port: int, limits: HttpLimits | None = None, *, server: HttpServer = "granian",
          log_level: str = "info", access_log: bool = False, drain_timeout: float = 30.0) -> None:
    """Serve ``app`` on ``host:port`` with ``limits`` until SIGINT/SIGTERM; in-flight requests finish first."""
    limits = limits or HttpLimits()
    limits.check()
    if server == "granian":
        _run_granian(app, host, port, limits, log_level=log_level, access_log=access_log)
        logger.info("retrieval server stopped")
        return
    import uvicorn

    logger.warning("serving with uvicorn: it has no header read timeout (a half-sent request head holds its "
                   "connection); granian is the default for that reason")
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log,
                timeout_graceful_shutdown=int(drain_timeout), **uvicorn_options(limits))
    logger.info("retrieval server stopped")
