"""The GAIA agent's tools, called the way Strands calls them: calculator, HTTP, file reading, Python."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rllm.tools import calculator, gaia_tools, make_file_read_tool, make_http_request_tool, make_python_exec_tool
from rllm.tools.python_exec import sandbox_problem

# ----------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [("17 * 23 + 4", "395"), ("2^10", "1024"), ("10 / 4", "2.5"), ("7 // 2", "3"), ("-(3 - 5) ** 2", "-4"),
     ("sqrt(16) * 2", "8"), ("round(2 / 3, 3)", "0.667"), ("log(8, 2)", "3"), ("factorial(5)", "120"),
     ("max(3, 9, 4) % 5", "4"), ("2 * pi", "6.283185307179586")],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator(expression=expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [("__import__('os').system('echo hi')", "unsupported element Call"),
     ("__import__('os')", "unknown function '__import__'"),
     ("open('/etc/passwd')", "unknown function 'open'"),
     ("(1).__class__", "unsupported element Attribute"),
     ("'a' * 3", "unsupported element Constant"),
     ("abc + 1", "unknown name 'abc'"),
     ("9 ** 9 ** 9", "exponent"),
     ("factorial(5000)", "factorial argument above"),
     ("1 / 0", "ZeroDivisionError"),
     ("2 +", "not a valid expression")],
)
def test_calculator_refuses_anything_but_arithmetic(expression: str, message: str) -> None:
    result = calculator(expression=expression)
    assert result.startswith("Error: ") and message in result


def test_tool_set_is_built_per_work_dir(tmp_path: Path) -> None:
    tools = gaia_tools(tmp_path)
    assert [t.tool_name for t in tools] == ["calculator", "http_request", "file_read", "python_exec"]
    assert [t.tool_name for t in gaia_tools(tmp_path, include_http=False)] == ["calculator", "file_read", "python_exec"]
    spec = next(t for t in tools if t.tool_name == "file_read").tool_spec
    assert spec["inputSchema"]["json"]["required"] == ["path"]


# ----------------------------------------------------------------------------- file_read


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("first line\nsecond line\n")
    (work / "data.csv").write_text("name,score\nAna,3\nBen,5\n")
    (work / "info.json").write_text('{"a": 1, "b": [1, 2]}')
    (work / "sheet.xlsx").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    (work / "sub").mkdir()
    (tmp_path / "secret.txt").write_text("top secret")
    (work / "link.txt").symlink_to(tmp_path / "secret.txt")
    return work


def test_file_read_shows_text_csv_json_and_listings(work_dir: Path) -> None:
    file_read = make_file_read_tool(work_dir)
    assert file_read(path="notes.txt") == "first line\nsecond line\n"
    assert file_read(path=str(work_dir / "notes.txt")) == "first line\nsecond line\n"
    assert file_read(path="data.csv") == (
        "CSV table: 2 data rows x 2 columns (first row is the header)\nname | score\nAna | 3\nBen | 5")
    assert json.loads(file_read(path="info.json")) == {"a": 1, "b": [1, 2]}
    assert "\n  " in file_read(path="info.json")
    listing = file_read(path=".")
    assert "notes.txt  (23 bytes)" in listing and "  sub/" in listing


def test_file_read_describes_binaries_instead_of_dumping_them(work_dir: Path) -> None:
    result = make_file_read_tool(work_dir)(path="sheet.xlsx")
    assert result.startswith("sheet.xlsx is a binary file (1,028 bytes, application/vnd.openxmlformats")
    assert "python_exec" in result


def test_file_read_pages_long_content(work_dir: Path) -> None:
    (work_dir / "long.txt").write_text("abcdefghij" * 3)
    file_read = make_file_read_tool(work_dir, max_chars=12)
    first = file_read(path="long.txt")
    assert first == "abcdefghijab\n[characters 0-12 of 30; call again with offset=12 for more]"
    assert file_read(path="long.txt", offset=24) == "efghij\n[characters 24-30 of 30]"


@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt", "link.txt", "/etc/hostname", "~/.bashrc"])
def test_file_read_refuses_paths_outside_the_work_dir(work_dir: Path, path: str) -> None:
    result = make_file_read_tool(work_dir)(path=path)
    assert result.startswith("Error: access denied:") and "outside the work directory" in result
    assert "top secret" not in result


def test_file_read_reports_missing_files(work_dir: Path) -> None:
    assert make_file_read_tool(work_dir)(path="nope.txt").startswith("Error: no such file: 'nope.txt'")


# ----------------------------------------------------------------------------- http_request


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/text":
            self._send(200, "plain café".encode(), "text/plain; charset=utf-8")
        elif self.path == "/html":
            page = (b"<html><head><title>T</title><script>var x=1;</script></head>"
                    b"<body><h1>Hello</h1><p>A &amp; B</p></body></html>")
            self._send(200, page, "text/html")
        elif self.path == "/big":
            self._send(200, b"x" * 3_000_000, "text/plain")
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, b"late", "text/plain")
        else:
            self._send(404, b"no such page", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        echo = {"content_type": self.headers["Content-Type"], "body": body.decode(), "x": self.headers.get("X-Test")}
        self._send(201, json.dumps(echo).encode(), "application/json")


_LOCAL = ("127.0.0.1",)  # the test server is on loopback, which http_request refuses unless allowed


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_http_get_returns_status_and_text(http_url: str) -> None:
    http_request = make_http_request_tool(allowed_networks=_LOCAL)
    assert await http_request(url=f"{http_url}/text") == (
        f"HTTP 200 OK\nURL: {http_url}/text\ncontent-type: text/plain; charset=utf-8\n\nplain café")
    html = await http_request(url=f"{http_url}/html")
    assert html.endswith("\n\nHello\nA & B") and "var x" not in html
    missing = await http_request(url=f"{http_url}/missing")
    assert missing.startswith("HTTP 404 Not Found") and missing.endswith("no such page")


async def test_http_post_sends_the_body_and_headers(http_url: str) -> None:
    http_request = make_http_request_tool(allowed_networks=_LOCAL)
    result = await http_request(url=f"{http_url}/echo", method="post", body='{"q": 1}', headers={"X-Test": "yes"})
    assert result.startswith("HTTP 201 Created")
    echo = json.loads(result.split("\n\n", 1)[1])
    assert echo == {"content_type": "application/json", "body": '{"q": 1}', "x": "yes"}


async def test_http_caps_size_and_time(http_url: str) -> None:
    capped = await make_http_request_tool(allowed_networks=_LOCAL, max_bytes=1000, max_chars=100_000)(
        url=f"{http_url}/big")
    assert "[body cut at 1,000 bytes]" in capped and capped.endswith("\n\n" + "x" * 1000)
    truncated = await make_http_request_tool(allowed_networks=_LOCAL, max_chars=50)(url=f"{http_url}/big")
    assert truncated.endswith("x" * 50 + "\n[text truncated to 50 of 2,097,152 characters]")
    started = time.perf_counter()
    slow = await make_http_request_tool(allowed_networks=_LOCAL, timeout=0.5)(url=f"{http_url}/slow")
    assert slow == f"Error: the request to {http_url}/slow timed out after 0.5 s"
    assert time.perf_counter() - started < 2.5


async def test_http_failures_come_back_as_text() -> None:
    http_request = make_http_request_tool(allowed_networks=_LOCAL, timeout=5)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    unreachable = await http_request(url=f"http://127.0.0.1:{closed_port}/")
    assert unreachable.startswith(f"Error: the request to http://127.0.0.1:{closed_port}/ failed: ConnectError")
    assert await http_request(url="file:///etc/passwd") == "Error: only http and https URLs are supported, not 'file:///etc/passwd'"
    assert await http_request(url="http://x", method="DELETE") == "Error: unsupported method 'DELETE'; use GET or POST"


# ----------------------------------------------------------------------------- python_exec
# In the bubblewrap sandbox where it works here, under the guard alone elsewhere (the guard runs in both).
_SANDBOX = "bwrap" if sandbox_problem() is None else "guard"


def _python_tool(work_dir: Path, **options: object) -> object:
    return make_python_exec_tool(work_dir, sandbox=_SANDBOX, **options)



async def test_python_runs_in_the_work_dir_with_a_minimal_isolated_env(work_dir: Path) -> None:
    python_exec = _python_tool(work_dir, timeout=20)
    code = ("import os, sys, csv\nprint(os.getcwd())\nprint(sys.flags.isolated)\nprint(sorted(os.environ))\n"
            "print(sum(int(r['score']) for r in csv.DictReader(open('data.csv'))))\n"
            "open('out.txt', 'w').write('made here')")
    result = await python_exec(code=code)
    lines = result.splitlines()
    assert lines[:3] == ["exit code 0", "--- stdout ---", str(work_dir.resolve())]
    assert lines[3] == "1"
    assert set(eval(lines[4])) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "MPLBACKEND", "OMP_NUM_THREADS",
                                   "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert lines[5] == "8"
    assert (work_dir / "out.txt").read_text() == "made here"  # files persist for file_read and later calls
    assert make_file_read_tool(work_dir)(path="out.txt") == "made here"


async def test_python_errors_show_the_users_traceback(work_dir: Path) -> None:
    result = await _python_tool(work_dir)(code="x = 1\nprint('before')\nx / 0")
    assert result.startswith("exit code 1\n--- stdout ---\nbefore\n--- stderr ---\nTraceback")
    assert 'File "<python_exec>", line 3' in result and result.endswith("ZeroDivisionError: division by zero")
    assert "_sandbox_guard" not in result


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)"])
async def test_python_is_stopped_at_its_time_limit(work_dir: Path, code: str) -> None:
    # 3 s, not 1: the limit includes the sandboxed interpreter's start, over 1 s on a CPU busy with CI's verl runs.
    started = time.perf_counter()
    result = await _python_tool(work_dir, timeout=3.0)(code="print('started', flush=True)\n" + code)
    elapsed = time.perf_counter() - started
    assert result.startswith("Error: the code ran longer than the 3 s time limit and was stopped.")
    assert "started" in result  # what it printed before it was stopped is kept
    assert elapsed < 6


@pytest.mark.parametrize(
    ("code", "refusal"),
    [("print(open('../secret.txt').read())", "may not read '../secret.txt'"),
     ("print(open('link.txt').read())", "may not read 'link.txt'"),
     ("open('../escape.txt', 'w').write('x')", "may not write to '../escape.txt'"),
     ("import os\nos.chdir('..')", "may not write to '..' (os.chdir)"),
     ("import os\nprint(os.listdir('..'))", "may not read '..' (os.listdir)"),
     ("import os\nos.symlink('../secret.txt', 'sneaky')", "may not write to"),
     ("import shutil\nshutil.copy('notes.txt', '../copied.txt')", "may not write to '../copied.txt'"),
     ("import os\nos.remove('../secret.txt')", "may not write to '../secret.txt' (os.remove)"),
     ("import subprocess\nsubprocess.run(['cat', '../secret.txt'])", "may not start or signal processes"),
     ("import os\nos.system('cat ../secret.txt')", "may not start or signal processes (os.system)"),
     ("import ctypes\nctypes.CDLL('libc.so.6')", "may not load native libraries"),
     ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "has no network access (socket.getaddrinfo)"),
     ("import socket\nsocket.socket().connect(('127.0.0.1', 9))", "has no network access (socket.connect)")],
)
async def test_python_cannot_reach_outside_its_work_dir(work_dir: Path, code: str, refusal: str) -> None:
    result = await _python_tool(work_dir, timeout=20)(code=code)
    assert result.startswith("exit code 1") and "PermissionError: python_exec " + refusal in result.replace("\n", " ")
    assert "top secret" not in result
    assert sorted(p.name for p in work_dir.parent.iterdir()) == ["secret.txt", "work"]
    assert (work_dir.parent / "secret.txt").read_text() == "top secret"


async def test_python_output_and_memory_are_capped(work_dir: Path) -> None:
    flood = await _python_tool(work_dir, max_output_bytes=1000)(code="print('y' * 1_000_000)")
    assert flood.endswith("[stdout truncated: 999,001 more bytes]")
    hog = await _python_tool(work_dir, memory_bytes=512 * 1024**2)(code="block = bytearray(2 * 1024**3)")
    assert hog.startswith("exit code 1") and hog.endswith("MemoryError")


async def test_python_allows_scientific_libraries(work_dir: Path) -> None:
    pytest.importorskip("pandas")
    result = await _python_tool(work_dir, timeout=60)(
        code="import pandas as pd\nprint(int(pd.read_csv('data.csv')['score'].sum()))")
    assert result == "exit code 0\n--- stdout ---\n8"


def test_python_exec_is_not_given_the_parent_environment(work_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_TEST_SECRET", "s3cret")
    import asyncio

    result = asyncio.run(_python_tool(work_dir)(code="import os\nprint(os.environ.get('RLLM_TEST_SECRET'))"))
    assert result == "exit code 0\n--- stdout ---\nNone"
    assert os.environ["RLLM_TEST_SECRET"] == "s3cret"
