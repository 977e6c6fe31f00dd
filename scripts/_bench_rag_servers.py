"""bench_rag's servers under test (this server, a baseline checkout, rLLM's anchor) and one ``wrk`` level on each.

Private to ``scripts/bench_rag.py``, which puts the repository on ``sys.path`` before importing it.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _bench_rag_data import QuerySource

from rag.manifest import Manifest
from rllm.processes import free_port, log_tail

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("bench_rag")
RL_REPEATS = 8


_WRK_LUA = r"""
-- Posts the bodies of a file (one JSON body per line) in order, each once; stops a thread when its share runs out.
-- With several threads (args[2] of them) thread t takes lines t, t + n, t + 2n, ..., so no body is sent twice.
local threads, counter = {}, 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  threads[#threads + 1] = thread
end
local bodies, i = {}, 0
exhausted = false
function init(args)
  local n, me, line_no = tonumber(args[2]) or 1, tid or 0, 0
  for line in io.lines(args[1]) do
    if line_no % n == me then bodies[#bodies + 1] = line end
    line_no = line_no + 1
  end
end
function request()
  i = i + 1
  if i > #bodies then exhausted = true; i = #bodies end
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json"}, bodies[i])
end
function response(status, headers, body)
  if exhausted then wrk.thread:stop() end
end
function done(summary, latency, requests)
  local e, ran_out = summary.errors, false
  for _, t in ipairs(threads) do ran_out = ran_out or t:get("exhausted") == true end
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "p50": %d, "p95": %d, "p99": %d, "exhausted": %s}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), tostring(ran_out)))
end
"""


@dataclass
class LevelResult:
    """One system at one concurrency and mix."""

    system: str
    mix: str
    concurrency: int
    requests: int
    seconds: float
    qps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    mean_batch: float
    server_cpu_ms: float  # server CPU per answered request
    client_cpu_share: float  # the load generator's CPU time / wall time (1.0 = one whole core)
    note: str = ""


def wrk_binary(path: str | None = None) -> str | None:
    """The wrk binary: ``path``, else wrk on PATH, else the Debian package (root with apt-get); None if none.

    ``path`` must be executable (e.g. a wrapper setting ``LD_LIBRARY_PATH`` for a copy unpacked with ``dpkg -x``).
    """
    if path:
        return path if os.access(path, os.X_OK) else None
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    logger.info("wrk is missing: installing the Debian package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        if subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode != 0:
            return None
    return shutil.which("wrk")


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (the server's compute process included)."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _wait_healthy(proc: subprocess.Popen, port: int, what: str, timeout: float = 300, log: Path | None = None) -> None:
    import httpx

    def tail() -> str:
        text = log_tail(log, 15) if log is not None else ""
        return f"; its log ends:\n{text}" if text else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"{what} did not become healthy in {timeout:.0f} s{tail()}")


def _stop(proc: subprocess.Popen, grace: float = 60) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class System:
    """A server under test: how to start a fresh one, and its batch counters where it has them."""

    name = ""
    stop_grace = 60.0  # seconds a SIGTERM gets before SIGKILL
    log: Path | None = None  # where its output goes (appended); None: discarded

    def start(self, port: int) -> subprocess.Popen:
        raise NotImplementedError

    def _output(self) -> Any:
        if self.log is None:
            return subprocess.DEVNULL
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as f:
            f.write(f"\n===== {self.name} {time.strftime('%H:%M:%S')}\n".encode())
        return self.log.open("ab")

    def mean_batch(self, port: int) -> float:
        return float("nan")


class ThisServer(System):
    """``rag.server`` from this checkout, or from another one (``--baseline-repo``: a before/after in one run)."""

    name = "this server"

    def __init__(self, index_dir: Path, max_batch_size: int | None, threads: int | None, extra: list[str],
                 repo: Path = REPO, name: str | None = None, log: Path | None = None) -> None:
        self.index_dir, self.max_batch_size, self.threads, self.extra = index_dir, max_batch_size, threads, extra
        self.repo = repo
        self.name = name or self.name
        self.log = log

    def start(self, port: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "rag.server", "--index-dir", str(self.index_dir), "--port", str(port),
               "--log-level", "warning", *self.extra]
        if self.max_batch_size:
            cmd += ["--max-batch-size", str(self.max_batch_size)]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        pythonpath = os.pathsep.join(p for p in (str(self.repo), os.environ.get("PYTHONPATH", "")) if p)
        out = self._output()
        try:
            return subprocess.Popen(cmd, cwd=self.repo, env={**os.environ, "PYTHONPATH": pythonpath},
                                    stdout=out, stderr=subprocess.STDOUT)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def mean_batch(self, port: int) -> float:
        import httpx

        b = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).json()["batches"]
        return float(b["mean_size"])


class Anchor(System):
    """rLLM's ``rag_server.py`` run from a scratch folder, encoder pointed at the offline MiniLM."""

    name = "rLLM rag_server.py"
    stop_grace = 10.0  # it holds no state; a queue of thousands of CPU-FAISS queries need not be drained

    def __init__(self, source: Path, index_dir: Path, batch_timeout: float, max_batch_size: int,
                 embedding_device: str = "cpu", log: Path | None = None) -> None:
        from rag.encoder import resolve_encoder

        self.log = log
        self.dir = Path(tempfile.mkdtemp(prefix="rag-anchor-"))
        code = source.read_text(encoding="utf-8")
        target = 'SentenceTransformer("intfloat/e5-base-v2"'
        if target not in code:
            raise ValueError(f"{source} does not load intfloat/e5-base-v2 as expected; is it commit 94676225?")
        m = Manifest.load(index_dir)
        encoder = resolve_encoder(m.encoder, index_dir)  # the encoder the index was built with (MiniLM by default)
        (self.dir / "rag_server.py").write_text(code.replace(target, f"SentenceTransformer({encoder!r}"))
        data = self.dir / "data"
        data.mkdir()
        (data / "corpus.json").symlink_to(m.path(index_dir, m.corpus_file))
        (data / "e5_Flat.index").symlink_to(m.path(index_dir, m.index_file))
        # Its index stays on CPU FAISS (--no_gpu; faiss-gpu is absent where the issue measured it), its encoder
        # runs where --anchor-device says.
        self.args = ["--data_dir", str(data), "--no_gpu", "--embedding_device", embedding_device,
                     "--batch_timeout", str(batch_timeout), "--max_batch_size", str(max_batch_size)]
        where = "" if embedding_device == "cpu" else f", encoder on {embedding_device}"
        self.name = f"rLLM rag_server.py ({batch_timeout * 1e3:.0f} ms window, batch {max_batch_size}{where})"

    def start(self, port: int) -> subprocess.Popen:
        out = self._output()
        try:
            return subprocess.Popen([sys.executable, "rag_server.py", *self.args, "--port", str(port)], cwd=self.dir,
                                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
                                    stdout=out, stderr=subprocess.STDOUT)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _bodies(queries: QuerySource, mix: str, n: int, top_k: int = 3) -> list[str]:
    if mix == "distinct":
        return [json.dumps({"query": q, "top_k": top_k}) for q in queries.take(n)]
    groups = queries.take(-(-n // RL_REPEATS))  # RL: the 8 rollouts of a group ask the same question together
    return [json.dumps({"query": q, "top_k": top_k}) for q in groups for _ in range(RL_REPEATS)][:n]


def run_level(wrk: str, system: System, mix: str, concurrency: int, duration: float, pool: int,
              queries: QuerySource, wrk_threads: int = 1) -> LevelResult:
    """A fresh server, a short distinct warm-up, then ``wrk`` for ``duration`` s at ``concurrency`` connections.

    The connections are spread over ``wrk_threads`` threads (at most one per connection), each posting its
    own share of the bodies.
    """
    import httpx

    threads = max(1, min(wrk_threads, concurrency))
    port = free_port()
    proc = system.start(port)
    workdir = Path(tempfile.mkdtemp(prefix="rag-wrk-"))
    try:
        _wait_healthy(proc, port, system.name, log=system.log)
        for q in queries.take(4):
            httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"query": q, "top_k": 3}, timeout=60)
        (workdir / "bench.lua").write_text(_WRK_LUA)
        (workdir / "bodies.txt").write_text("\n".join(_bodies(queries, mix, pool)) + "\n")
        batch_before = system.mean_batch(port)
        server_cpu = _cpu_seconds(proc.pid)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        out = subprocess.run([wrk, f"-t{threads}", f"-c{concurrency}", f"-d{duration:g}s", "--timeout", "60s",
                              "-s", str(workdir / "bench.lua"), f"http://127.0.0.1:{port}/retrieve", "--",
                              str(workdir / "bodies.txt"), str(threads)], capture_output=True, text=True,
                             timeout=duration + 120)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = _cpu_seconds(proc.pid) - server_cpu
        mean_batch = system.mean_batch(port)
        del batch_before
    finally:
        _stop(proc, system.stop_grace)
        shutil.rmtree(workdir, ignore_errors=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {out.stdout[-500:]} {out.stderr[-500:]}")
    w = json.loads(line[len("WRKJSON "):])
    seconds = w["duration_us"] / 1e6
    errors = w["connect"] + w["read"] + w["write"] + w["status"] + w["timeout"]
    client_cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    result = LevelResult(system.name, mix, concurrency, w["requests"], seconds, (w["requests"] - w["status"]) / seconds,
                         w["p50"] / 1e3, w["p95"] / 1e3, w["p99"] / 1e3, errors, mean_batch,
                         server_cpu / max(1, w["requests"]) * 1e3, client_cpu / wall,
                         "bodies ran out; raise --pool" if w["exhausted"] else "")
    logger.info("%s %s c=%d: %.1f q/s p50 %.1f ms p99 %.1f ms errors %d mean batch %.1f server CPU %.2f ms/q, "
                "wrk CPU %.0f%% of a core", system.name, mix, concurrency, result.qps, result.p50_ms, result.p99_ms,
                errors, mean_batch, result.server_cpu_ms, 100 * result.client_cpu_share)
    return result
