"""GAIA data: the loader on the demo tasks shipped in the package, and scripts/prepare_gaia.py against a local fake Hub.

The fake Hub is a real HTTP server on 127.0.0.1 speaking the parts of the Hugging Face API that
``huggingface_hub.snapshot_download`` uses (repo info, tree listing, file resolve), with gating
and token checks, so the real download code runs end to end without network.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from rllm.data.gaia import GAIA_DEMO_DIR, load_gaia

ROOT = Path(__file__).resolve().parents[3]
DEMO = GAIA_DEMO_DIR
PREPARE = ROOT / "scripts" / "prepare_gaia.py"
TOKEN = "hf_valid_test_token"
SHA = "0123456789abcdef0123456789abcdef01234567"

# ----------------------------------------------------------------------------- loader


def test_loader_reads_the_demo_tasks_with_absolute_attachment_paths() -> None:
    tasks = load_gaia(DEMO, "validation")
    assert len(tasks) == 8
    assert [t["level"] for t in tasks] == [1, 1, 1, 2, 2, 3, 3, 3]
    first = tasks[0]
    assert first == {"id": "0f6a3b1e-7c2d-4e8f-9a0b-1c2d3e4f5a01",
                     "question": "What is 1,234 * 5 + 6? Answer with the number only.",
                     "level": 1, "final_answer": "6176", "file_name": None, "file_path": None}
    csv_task = tasks[1]
    path = Path(csv_task["file_path"])
    assert path.is_absolute() and path.parent == (DEMO / "2023" / "validation").resolve()
    assert path.read_text().splitlines()[-1] == "TOTAL,40,77,117"
    suffixes = sorted(Path(t["file_path"]).suffix for t in tasks if t["file_path"])
    assert suffixes == [".csv", ".json", ".py", ".py", ".txt"]


def test_loader_filters_levels_and_limits() -> None:
    assert [t["level"] for t in load_gaia(DEMO, level=3)] == [3, 3, 3]
    assert [t["level"] for t in load_gaia(DEMO, level=[1, 3], limit=4)] == [1, 1, 1, 3]
    assert len(load_gaia(DEMO / "2023" / "validation", limit=2)) == 2  # a split dir works too
    with pytest.raises(ValueError, match=r"levels are 1, 2 and 3, not \[4\]"):
        load_gaia(DEMO, level=4)


def test_loader_reads_the_test_split_with_hidden_answers() -> None:
    (task,) = load_gaia(DEMO, "test")
    assert task["final_answer"] == "?" and task["level"] == 1


def test_loader_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no GAIA metadata in .*prepare_gaia.py"):
        load_gaia(tmp_path)
    split = tmp_path / "2023" / "validation"
    split.mkdir(parents=True)
    row = {"task_id": "t1", "Question": "q", "Level": 1, "Final answer": "1", "file_name": "gone.pdf"}
    (split / "metadata.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(FileNotFoundError, match=r"GAIA task t1: attachment .*gone.pdf is missing"):
        load_gaia(tmp_path)
    (split / "metadata.jsonl").write_text(json.dumps({**row, "file_name": "../../x"}) + "\n")
    with pytest.raises(ValueError, match="points outside"):
        load_gaia(tmp_path)
    (split / "metadata.jsonl").write_text(json.dumps({**row, "file_name": "", "Level": "7"}) + "\n")
    with pytest.raises(ValueError, match="Level '7' is not 1, 2 or 3"):
        load_gaia(tmp_path)


def test_loader_reads_parquet_metadata(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    split = tmp_path / "2023" / "validation"
    split.mkdir(parents=True)
    (split / "a.txt").write_text("hi")
    table = pa.table({"task_id": ["t1", "t2"], "Question": ["q1", "q2"], "Level": ["2", "3"],
                      "Final answer": ["x", "y"], "file_name": ["a.txt", ""]})
    pq.write_table(table, split / "metadata.parquet")
    tasks = load_gaia(tmp_path)
    assert [(t["id"], t["level"], t["file_path"]) for t in tasks] == [("t1", 2, str(split / "a.txt")), ("t2", 3, None)]


# ----------------------------------------------------------------------------- prepare_gaia.py


def _fake_hub(files: dict[str, bytes], *, gated: bool) -> FastAPI:
    """The Hub endpoints snapshot_download calls, for dataset gaia-benchmark/GAIA only."""
    app = FastAPI()

    def refuse(request: Request) -> JSONResponse | None:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "Repository not found"}, status_code=401,
                                headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        if gated:
            return JSONResponse({"error": "Access to dataset gaia-benchmark/GAIA is restricted"}, status_code=403,
                                headers={"X-Error-Code": "GatedRepo", "X-Error-Message": "Access is restricted"})
        return None

    @app.get("/api/datasets/gaia-benchmark/GAIA/revision/{revision}")
    async def repo_info(revision: str, request: Request) -> object:
        return refuse(request) or {"id": "gaia-benchmark/GAIA", "sha": SHA, "private": False, "gated": "manual",
                                   "siblings": [{"rfilename": path} for path in files]}

    @app.get("/api/datasets/gaia-benchmark/GAIA/tree/{revision}")
    async def tree(revision: str, request: Request) -> object:
        return refuse(request) or [
            {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
            for path, data in files.items()
        ]

    @app.api_route("/datasets/gaia-benchmark/GAIA/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
    async def resolve(revision: str, path: str, request: Request) -> Response:
        refused = refuse(request)
        if refused is not None:
            return refused
        if path not in files:
            return JSONResponse({"error": "Entry not found"}, status_code=404,
                                headers={"X-Error-Code": "EntryNotFound"})
        data = files[path]
        etag = f'"{hashlib.sha1(data).hexdigest()}"'
        headers = {"X-Repo-Commit": SHA, "ETag": etag, "Content-Length": str(len(data))}
        return Response(content=b"" if request.method == "HEAD" else data, headers=headers,
                        media_type="application/octet-stream")

    return app


@pytest.fixture
def fake_hub() -> Iterator[object]:
    servers: list[uvicorn.Server] = []

    def start(files: dict[str, bytes], gated: bool = False) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(_fake_hub(files, gated=gated), log_level="warning", lifespan="off"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        servers.append(server)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server in servers:
        server.should_exit = True


def _hub_files() -> dict[str, bytes]:
    """The demo tasks, laid out as in the Hub repository, plus files the script must not fetch."""
    files = {"README.md": b"# GAIA", "2024/validation/metadata.jsonl": b"{}\n"}
    for split in ("validation", "test"):
        for path in (DEMO / "2023" / split).iterdir():
            files[f"2023/{split}/{path.name}"] = path.read_bytes()
    return files


def _prepare(
    tmp_path: Path, *args: str, endpoint: str | None = None, token: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    else:
        env["HF_HUB_OFFLINE"] = "1"
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, str(PREPARE), "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_prepare_downloads_the_splits_with_attachments(tmp_path: Path, fake_hub: object) -> None:
    endpoint = fake_hub(_hub_files())
    run = _prepare(tmp_path, "--token", TOKEN, endpoint=endpoint)
    assert run.returncode == 0, run.stderr
    # A token typed on the command line still works, with one line saying that `ps` shows it (never the token).
    assert ("--token on the command line is visible to every user of this machine (ps); set HF_TOKEN in the "
            "environment instead") in run.stderr and TOKEN not in run.stderr
    assert "validation: 8 tasks (level 1: 3, level 2: 2, level 3: 3), 5 attachments" in run.stdout
    assert "test: 1 tasks (level 1: 1), 0 attachments; answers hidden for 1" in run.stdout
    data = tmp_path / "data"
    assert not (data / "README.md").exists() and not (data / "2024").exists()
    split = data.resolve() / "2023" / "validation"
    expected = [{**t, "file_path": t["file_path"] and str(split / t["file_name"])} for t in load_gaia(DEMO)]
    assert load_gaia(data) == expected
    assert (data / "2023/validation/3f1c2a9e-0b7d-4c55-9a1e-6d2f8b1c0a11.csv").read_bytes() == (
        DEMO / "2023/validation/3f1c2a9e-0b7d-4c55-9a1e-6d2f8b1c0a11.csv").read_bytes()


def test_prepare_writes_jsonl_from_the_repositorys_parquet(tmp_path: Path, fake_hub: object) -> None:
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    table = pa.table({"task_id": ["p1"], "Question": ["How many?"], "Level": ["2"], "Final answer": ["3"],
                      "file_name": ["p1.txt"], "file_path": ["2023/validation/p1.txt"],
                      "Annotator Metadata": [{"Steps": "count"}]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    files = {"2023/validation/metadata.parquet": buffer.getvalue(), "2023/validation/p1.txt": b"a b c"}
    run = _prepare(tmp_path, "--split", "validation", endpoint=fake_hub(files), token=TOKEN)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (tmp_path / "data/2023/validation/metadata.jsonl").read_text().splitlines()]
    assert rows == [{"task_id": "p1", "Question": "How many?", "Level": "2", "Final answer": "3", "file_name": "p1.txt",
                     "file_path": "2023/validation/p1.txt", "Annotator Metadata": {"Steps": "count"}}]
    assert "validation: 1 tasks (level 2: 1), 1 attachments" in run.stdout
    assert "on the command line" not in run.stderr  # the token came from HF_TOKEN


@pytest.mark.parametrize(
    ("gated", "token", "message"),
    [(True, TOKEN, "your token has no access to the gated dataset gaia-benchmark/GAIA: open "
                   "https://huggingface.co/datasets/gaia-benchmark/GAIA while logged in, accept its conditions"),
     (False, "hf_wrong", "the Hub did not let this token see gaia-benchmark/GAIA: check that the token is valid")],
)
def test_prepare_explains_refused_access(
    tmp_path: Path, fake_hub: object, gated: bool, token: str, message: str
) -> None:
    run = _prepare(tmp_path, "--token", token, endpoint=fake_hub(_hub_files(), gated=gated))
    assert run.returncode == 1
    assert f"error: {message}" in run.stderr and "Traceback" not in run.stderr


def test_prepare_names_the_token_s_variable_in_its_help(tmp_path: Path) -> None:
    run = _prepare(tmp_path, "--help")
    assert run.returncode == 0 and "$HF_TOKEN" in " ".join(run.stdout.split())


def test_prepare_without_token_or_network_fails_with_a_message(tmp_path: Path) -> None:
    no_token = _prepare(tmp_path)
    assert no_token.returncode == 1 and "Traceback" not in no_token.stderr
    assert "error: no Hugging Face token: gaia-benchmark/GAIA is gated" in no_token.stderr
    offline = _prepare(tmp_path, "--token", TOKEN)
    assert offline.returncode == 1 and "Traceback" not in offline.stderr
    assert "error: cannot reach the Hugging Face Hub" in offline.stderr
