"""Servers run as subprocesses: a free port, a process group, a log file, a health check, a clean stop.

The embedded retrieval server (``rllm.eval.search.RetrievalProcess``) and the LiteLLM trace proxy
(``rllm.tracing.ProxyProcess``) both start a server this way and wait for it to answer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm.errors import ServerStartError

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int, missing: str = "") -> str:
    """The last ``lines`` lines of a log file, or ``missing`` when it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return missing


class ServerProcess:
    """A server started in its own process group, its output (stdout and stderr) in ``log_path``.

    Args:
        command: The command line.
        log_path: Where its output goes (parent directories are created).
        env: Its environment (default: this process's).
        cwd: Its working directory.
        append: Append to the log instead of starting it afresh.
    """

    def __init__(self, command: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, append: bool = False) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab" if append else "wb") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                                            cwd=cwd, start_new_session=True)

    @property
    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process.poll() is None

    def wait_ready(self, health_url: str, timeout: float, interval: float = 0.5) -> Any:
        """Poll ``health_url`` until it answers 200 and return that ``httpx.Response``.

        Raises ``ServerStartError`` (``returncode`` set) as soon as the process exits, or
        (``returncode`` ``None``) after ``timeout`` seconds.
        """
        import httpx  # lazily: the proxy's own environment imports rllm.tracing without it

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerStartError(f"exited with status {self.process.returncode} before it was ready",
                                       returncode=self.process.returncode)
            try:
                response = httpx.get(health_url, timeout=2.0)
                if response.status_code == 200:
                    return response
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"did not answer {health_url} within {timeout:.0f} s")
            time.sleep(interval)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %s s; killing it", self.process.args, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
