"""Run an ASGI app with uvicorn on a free 127.0.0.1 port in a daemon thread (test and demo servers)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

logger = logging.getLogger(__name__)


class UvicornThread:
    """One uvicorn server on 127.0.0.1 in a background thread; ``stop`` lets requests in flight finish.

    Args:
        app: The ASGI app.
        name: Thread-name prefix and the name used in errors and logs.
        **config: Passed to ``uvicorn.Config`` (``lifespan``, ``backlog``, ``timeout_graceful_shutdown``...).
    """

    def __init__(self, app: Any, *, name: str, **config: Any) -> None:
        self.app = app
        self.name = name
        self.config = {"log_level": "warning", "access_log": False, **config}
        self.port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, timeout: float = 10.0) -> int:
        """Bind a free port, serve, and return the port once uvicorn accepts requests."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} is already started")
        # Explicit IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
        # TCP, and without it keep-alive requests stall ~40 ms on Nagle + delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, **self.config))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"{self.name}-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                sock.close()
                raise RuntimeError(f"{self.name} failed to start")
            time.sleep(0.005)
        return self.port

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit (finishing requests in flight) and join its thread; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                logger.warning("%s thread did not exit in %.0f s", self.name, timeout)
        self._server = self._thread = None
