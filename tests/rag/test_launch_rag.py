"""``bash rag/launch_rag.sh`` serves the default index: a real server process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag.testing import demo_index
from rllm.processes import free_port

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "rag" / "launch_rag.sh"


def test_launch_serves_the_default_index_with_token_and_extra_args(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The no-data-dir path serves $RAG_CACHE_DIR, building it only when it has no manifest; point it at the
    # session's prebuilt demo index so the test does not rebuild it.
    cache = demo_index(tmp_path_factory.getbasetemp(), 200)
    port = free_port()
    env = {**os.environ, "RAG_CACHE_DIR": str(cache), "PYTHON": sys.executable, "RETRIEVAL_TOKEN": "launch-token"}
    env.pop("RAG_TOKEN", None)
    proc = subprocess.Popen(["bash", str(LAUNCH), "", str(port), "--max-top-k", "5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(f"{url}/health", timeout=2).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.25)
        assert health["corpus_size"] == 200 and health["auth"] is True
        assert health["limits"]["max_top_k"] == 5
        assert httpx.post(f"{url}/retrieve", json={"query": "Krull"}).status_code == 401
        auth = {"Authorization": "Bearer launch-token"}
        r = httpx.post(f"{url}/retrieve", json={"query": "Who directed Krull?", "top_k": 5}, headers=auth)
        assert r.status_code == 200 and len(r.json()["results"]) == 5
        assert httpx.post(f"{url}/retrieve", json={"query": "Krull", "top_k": 6}, headers=auth).status_code == 422
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    # granian (the default HTTP server, with its limits) stops gracefully on SIGTERM and the app drains.
    assert proc.returncode == 0, out
    assert "retrieval server stopped" in out
    # Bound to loopback only (the default host), with the default limits.
    assert f"granian on http://127.0.0.1:{port} (header timeout 10.0 s, max header 16384 B, max connections 2048)" in out
    # The token came from RETRIEVAL_TOKEN, not the command line: no warning about ps, and the token is never logged.
    assert "--token" not in out and "launch-token" not in out


def test_launch_names_a_data_dir_without_manifest(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(LAUNCH), str(tmp_path), "8123"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 2
    assert f"{tmp_path} has no manifest.json" in proc.stderr
