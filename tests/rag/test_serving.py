"""The server process holds against slow, silent and oversized clients (``python -m rag.server``, granian).

One real server on 127.0.0.1 with short timeouts (2 s) so the test stays quick; the defaults
(10 s) are checked separately. Every loop is bounded and every socket is loopback.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from rag.errors import HttpConfigError
from rag.serving import HttpLimits, granian_available
from rag.testing import demo_index
from rllm.errors import ServerStartError
from rllm.processes import ServerProcess, free_port, log_tail

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not granian_available(), reason="granian is not installed (rag extra)")]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2.0  # header and body timeout of the server under test
CAP = 96  # max connections of the server under test
MAX_HEADER = 16384


@dataclass
class _Server:
    url: str
    port: int
    proc: subprocess.Popen

    def rss_mb(self) -> float:
        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def fds(self) -> int:
        return psutil.Process(self.proc.pid).num_fds()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    index = demo_index(tmp_path_factory.getbasetemp(), 200)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RETRIEVAL_TOKEN", None)
    env.pop("RAG_TOKEN", None)
    log = tmp_path_factory.mktemp("limits") / "server.log"
    process = ServerProcess([sys.executable, "-m", "rag.server", "--index-dir", str(index), "--port", str(port),
                             "--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT),
                             "--max-connections", str(CAP), "--max-header-bytes", str(MAX_HEADER),
                             "--log-level", "warning"], log, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{url}/health", timeout=120, interval=0.2)
    except ServerStartError as error:
        process.stop()
        pytest.fail(f"server did not come up: {error}\n{log_tail(log, 40)}")
    yield _Server(url, port, process.process)
    process.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    return s


def _closing_times(sockets: list[socket.socket], start: float, limit: float) -> list[tuple[float, bytes]]:
    """Per socket, seconds from ``start`` until the server closed it (inf if open after ``limit``), and what it sent.

    All are watched at once, so a socket closed while another is read is timed when it closes.
    """
    found: dict[int, tuple[float, bytes]] = {}
    received = {i: b"" for i in range(len(sockets))}
    with selectors.DefaultSelector() as selector:
        for index, sock in enumerate(sockets):
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, index)
        while len(found) < len(sockets) and time.monotonic() - start < limit:
            for key, _ in selector.select(timeout=0.1):
                index = key.data
                try:
                    chunk = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    chunk = b""
                if chunk:
                    received[index] += chunk
                    continue
                found[index] = (time.monotonic() - start, received[index])
                selector.unregister(key.fileobj)
    return [found.get(i, (float("inf"), received[i])) for i in range(len(sockets))]


def _closed_after(s: socket.socket, start: float, limit: float) -> tuple[float, bytes]:
    """Seconds from ``start`` until the server closed ``s`` (inf if still open after ``limit``), and what it sent."""
    got = b""
    s.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start, got
        if not chunk:
            return time.monotonic() - start, got
        got += chunk
    return float("inf"), got


def _retrieve(url: str, query: str) -> int:
    return httpx.post(f"{url}/retrieve", json={"query": query}, timeout=10).status_code


def test_stalled_and_silent_connections_are_closed_while_retrieve_answers(server: _Server) -> None:
    start = time.monotonic()
    stalled: list[tuple[str, socket.socket]] = []
    for _ in range(32):  # half-sent bodies
        s = _connect(server.port)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"query\": \"sta")
        stalled.append(("body", s))
    for _ in range(16):  # half-sent heads
        s = _connect(server.port)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-le")
        stalled.append(("head", s))
    for _ in range(16):  # nothing at all
        stalled.append(("silent", _connect(server.port)))
    # Others are served meanwhile (in a thread: the stalled connections are timed while they are).
    answered: list[int] = []
    others = threading.Thread(target=lambda: answered.extend(
        _retrieve(server.url, f"who wrote stalled story {i}") for i in range(5)))
    others.start()
    times = _closing_times([s for _, s in stalled], start, TIMEOUT + 6)
    others.join(timeout=60)
    assert answered == [200] * 5
    results = [(kind, *closed) for (kind, _), closed in zip(stalled, times, strict=True)]
    for _, s in stalled:
        s.close()
    late = [(kind, round(t, 1)) for kind, t, _ in results if t > TIMEOUT + 2]
    assert not late, f"connections not closed within {TIMEOUT} s (+2 s slack): {late}"
    for kind, _, got in results:
        if kind == "body":  # the app answers a body that stopped coming with 408, then closes
            assert got.startswith(b"HTTP/1.1 408"), got[:80]
            assert b"not received within 2 s" in got
    assert _retrieve(server.url, "after the stalls") == 200


def test_idle_keep_alive_connection_is_closed(server: _Server) -> None:
    s = _connect(server.port)
    s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    start = time.monotonic()
    took, got = _closed_after(s, start, TIMEOUT + 6)
    s.close()
    assert got.startswith(b"HTTP/1.1 200")
    assert took <= TIMEOUT + 2


def _send_unterminated_header(port: int, size: int, out: list[bytes]) -> None:
    s = _connect(port)
    chunk = b"a" * (1 << 20)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
        for _ in range(size >> 20):
            s.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    _, got = _closed_after(s, time.monotonic(), TIMEOUT + 6)
    out.append(got)
    s.close()


def test_oversized_heads_are_refused_with_memory_flat(server: _Server) -> None:
    assert _retrieve(server.url, "warm the memory up") == 200
    before = server.rss_mb()
    replies: list[bytes] = []
    threads = [threading.Thread(target=_send_unterminated_header, args=(server.port, 16 << 20, replies))
               for _ in range(8)]
    peak = before
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, server.rss_mb())
        time.sleep(0.02)
    for t in threads:
        t.join(30)
    after = server.rss_mb()
    assert len(replies) == 8
    assert all(r == b"" or r.startswith(b"HTTP/1.1 431") for r in replies), [r[:40] for r in replies]
    assert max(peak, after) - before < 20, f"RSS {before:.0f} MB -> peak {peak:.0f} MB, after {after:.0f} MB"
    # A complete 10 MB head is refused too, and an ordinary one still passes.
    s = _connect(server.port)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (10 << 20) + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    _, got = _closed_after(s, time.monotonic(), TIMEOUT + 6)
    s.close()
    assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:40]
    assert httpx.get(f"{server.url}/health", headers={"x-fine": "a" * 4000}).status_code == 200


def test_connection_cap_holds_the_excess_back_then_recovers(server: _Server) -> None:
    base_fds = server.fds()
    silent = [_connect(server.port) for _ in range(CAP)]
    time.sleep(0.3)
    held_fds = server.fds()
    start = time.monotonic()
    status = _retrieve(server.url, "the one past the cap")
    waited = time.monotonic() - start
    for s in silent:
        s.close()
    assert status == 200
    # The excess waited in the listen backlog until the silent ones timed out: the cap held.
    assert waited >= TIMEOUT * 0.5, f"request past the cap answered in {waited:.2f} s"
    assert waited <= TIMEOUT + 4
    assert held_fds - base_fds <= CAP + 4
    assert [_retrieve(server.url, f"after the cap {i}") for i in range(3)] == [200] * 3


def test_default_limits_are_bounded() -> None:
    limits = HttpLimits()
    assert limits.header_timeout <= 10 and limits.max_header_bytes <= 65536 and limits.max_connections <= 4096
    from rag.server import ServerSettings

    assert ServerSettings().body_timeout <= 10
    with pytest.raises(HttpConfigError):
        HttpLimits(header_timeout=0).check()
    with pytest.raises(HttpConfigError):
        HttpLimits(max_header_bytes=100).check()
