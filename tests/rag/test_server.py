"""The retrieval server over real HTTP on 127.0.0.1, with a real FAISS index and the real MiniLM encoder."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rag.retriever import Retriever
from rag.server import ServerSettings
from rag.testing import RetrievalServer, SlowRetriever, demo_index

pytestmark = pytest.mark.timeout(120)

CORPUS_SIZE = 200


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_index(tmp_path_factory.getbasetemp(), CORPUS_SIZE)


@pytest.fixture(scope="module")
def retriever(index_dir: Path) -> Retriever:
    return Retriever.load(index_dir)


@pytest.fixture(scope="module")
def server(retriever: Retriever) -> Iterator[RetrievalServer]:
    with RetrievalServer(retriever) as srv:
        yield srv


@pytest.fixture
def fresh(retriever: Retriever) -> Iterator:
    """Start servers with their own settings (fresh metrics and cache) for one test."""
    started: list[RetrievalServer] = []

    def _start(settings: ServerSettings | None = None, delay: float = 0.0) -> RetrievalServer:
        inner = SlowRetriever(retriever, delay) if delay else retriever
        srv = RetrievalServer(inner, settings).start()
        started.append(srv)
        return srv

    yield _start
    for srv in started:
        srv.stop()


def test_passage_text_retrieves_that_passage_first(server: RetrievalServer, retriever: Retriever) -> None:
    for i in (0, 57, 123, 199):
        passage = retriever.corpus[i]
        r = httpx.post(f"{server.base_url}/retrieve", json={"query": passage["contents"], "top_k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["query"] == passage["contents"] and body["top_k"] == 3
        hits = body["results"]
        assert len(hits) == 3
        assert hits[0]["id"] == passage["id"] and hits[0]["title"] == passage["title"]
        assert hits[0]["contents"] == passage["contents"]
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_title_in_demo_corpus_answers_a_hotpotqa_style_question(server: RetrievalServer) -> None:
    r = httpx.post(f"{server.base_url}/retrieve", json={"query": "Who directed the 1983 fantasy film Krull?"})
    assert r.status_code == 200
    assert "Krull (film)" in [h["title"] for h in r.json()["results"]]  # default top_k is 10, as rLLM's


def test_batch_retrieve_answers_each_query_in_order(server: RetrievalServer, retriever: Retriever) -> None:
    texts = [retriever.corpus[i]["contents"] for i in (3, 4, 5)]
    r = httpx.post(f"{server.base_url}/batch_retrieve", json={"queries": texts, "top_k": 2})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [hits[0]["id"] for hits in results] == ["3", "4", "5"]
    assert all(len(hits) == 2 for hits in results)
    single = httpx.post(f"{server.base_url}/retrieve", json={"query": texts[1], "top_k": 2}).json()["results"]
    assert single == results[1]


async def test_concurrent_requests_are_batched(fresh, retriever: Retriever) -> None:
    srv = fresh()
    texts = [retriever.corpus[i]["contents"][:80] for i in range(100, 148)]
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/retrieve", json={"query": t, "top_k": 1}) for t in texts))
        metrics = (await client.get("/metrics")).json()
    assert [r.json()["results"][0]["id"] for r in replies] == [str(i) for i in range(100, 148)]
    batches = metrics["batches"]
    assert batches["max_size"] > 1 and batches["mean_size"] > 1
    assert batches["count"] < len(texts)
    assert sum(batches["histogram"].values()) == batches["count"]
    assert metrics["cache"]["computed"] == len(texts)


async def test_identical_queries_are_computed_once_and_then_cached(fresh) -> None:
    srv = fresh()
    body = {"query": "Which magazine was started first?", "top_k": 3}
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/retrieve", json=body) for _ in range(8)))
        assert {json.dumps(r.json()["results"]) for r in replies} == {json.dumps(replies[0].json()["results"])}
        cache = (await client.get("/metrics")).json()["cache"]
        assert cache["computed"] == 1
        assert cache["deduplicated"] + cache["hits"] == 7
        again = await client.post("/retrieve", json=body)
        cache2 = (await client.get("/metrics")).json()["cache"]
    assert again.json()["results"] == replies[0].json()["results"]
    assert cache2["computed"] == 1 and cache2["hits"] == cache["hits"] + 1
    assert cache2["hit_rate"] == pytest.approx(8 / 9, abs=1e-3)


_LONG = "a" * 2049
BAD_INPUTS = [
    # (endpoint, raw body, status, words the message must contain)
    ("/retrieve", b'{"query": "", "top_k": 3}', 422, ["query", "empty"]),
    ("/retrieve", b'{"query": "   \\n\\t ", "top_k": 3}', 422, ["query", "empty"]),
    ("/retrieve", b'{"query": 42}', 422, ["query", "string"]),
    ("/retrieve", b'{"query": null}', 422, ["query", "string"]),
    ("/retrieve", b'{"query": ["a"]}', 422, ["query", "string"]),
    ("/retrieve", b'{"query": "x", "top_k": 0}', 422, ["top_k", "between 1 and 100", "got 0"]),
    ("/retrieve", b'{"query": "x", "top_k": -2}', 422, ["top_k", "got -2"]),
    ("/retrieve", b'{"query": "x", "top_k": 101}', 422, ["top_k", "got 101"]),
    ("/retrieve", b'{"query": "x", "top_k": "3"}', 422, ["top_k", "integer"]),
    ("/retrieve", b'{"query": "x", "top_k": 2.5}', 422, ["top_k", "integer"]),
    ("/retrieve", b'{"query": "x", "top_k": true}', 422, ["top_k", "integer"]),
    ("/retrieve", b'{"top_k": 3}', 422, ["query", "required"]),
    ("/retrieve", b"{}", 422, ["query", "required"]),
    ("/retrieve", b'{"query": "x"', 400, ["invalid JSON"]),
    ("/retrieve", b"not json", 400, ["invalid JSON"]),
    ("/retrieve", b"", 400, ["invalid JSON"]),
    ("/retrieve", b'["x"]', 422, ["JSON object"]),
    ("/retrieve", json.dumps({"query": _LONG}).encode(), 422, ["query", "2049 characters", "limit is 2048"]),
    ("/retrieve", json.dumps({"query": "x" * 70_000}).encode(), 413, ["body", "limit", "65536"]),
    ("/batch_retrieve", b'{"queries": []}', 422, ["queries", "at least one"]),
    ("/batch_retrieve", b'{"queries": "x"}', 422, ["queries", "array"]),
    ("/batch_retrieve", b'{"queries": ["ok", " ", 7]}', 422, ["queries.1", "empty", "queries.2", "string"]),
    ("/batch_retrieve", json.dumps({"queries": ["q"] * 257}).encode(), 422, ["queries", "257", "limit is 256"]),
    ("/batch_retrieve", b'{"query": "x"}', 422, ["queries", "required"]),
    ("/batch_retrieve", b'{"queries": ["x"], "top_k": 0}', 422, ["top_k"]),
    # An unknown field is refused, never dropped: a misspelt "top_k" would otherwise change the answer silently.
    ("/retrieve", b'{"query": "x", "topk": 3}', 422, ["topk", "unknown field", "query, top_k, k"]),
    ("/retrieve", b'{"query": "x", "k": 0}', 422, ["k", "between 1 and 100", "got 0"]),
    ("/batch_retrieve", b'{"queries": ["x"], "k": 2}', 422, ["k", "unknown field", "queries, top_k"]),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), BAD_INPUTS,
                         ids=[f"{p}-{i}" for i, (p, *_rest) in enumerate(BAD_INPUTS)])
def test_bad_input_gets_a_4xx_naming_the_problem(server: RetrievalServer, path: str, body: bytes, status: int,
                                                  words: list[str]) -> None:
    r = httpx.post(f"{server.base_url}{path}", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    for word in words:
        assert word in detail, detail


def test_chunked_body_over_the_limit_is_refused(server: RetrievalServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"query": "'
        for _ in range(20):
            yield b"x" * 4096
        yield b'"}'

    r = httpx.post(f"{server.base_url}/retrieve", content=chunks())  # no Content-Length: chunked transfer
    assert r.status_code == 413
    assert "exceeds the limit of 65536 bytes" in r.json()["detail"]
    # The server is unharmed.
    assert httpx.post(f"{server.base_url}/retrieve", json={"query": "film"}).status_code == 200


@pytest.mark.parametrize("python_310", [False, True], ids=["timeout_at", "python-3.10-wait_for"])
def test_body_that_stops_coming_gets_408_and_others_are_served(fresh, python_310: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    if python_310:  # Python 3.10 has no asyncio.timeout_at: the server's other path (every POST was a 500 there)
        monkeypatch.setattr("rag.server._TIMEOUT_AT", None)
    srv = fresh(ServerSettings(body_timeout=0.5))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{\"query\": \"fi")
        assert httpx.post(f"{srv.base_url}/retrieve", json={"query": "film"}).status_code == 200
        start = time.monotonic()
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:80]
    assert b"request body not received within 0.5 s" in reply
    assert time.monotonic() - start < 2
    assert httpx.get(f"{srv.base_url}/metrics").json()["errors"] == {"408": 1}


def test_wrong_method_and_route_are_4xx(server: RetrievalServer) -> None:
    assert httpx.get(f"{server.base_url}/retrieve").status_code == 405
    assert httpx.post(f"{server.base_url}/nope", json={}).status_code == 404


async def test_overload_answers_503_with_retry_after(fresh) -> None:
    srv = fresh(ServerSettings(max_batch_size=1, max_queue=2, retry_after=2), delay=0.3)
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/retrieve", json={"query": f"question {i}"})
                                         for i in range(10)))
        metrics = (await client.get("/metrics")).json()
    statuses = sorted(r.status_code for r in replies)
    assert set(statuses) == {200, 503}
    assert statuses.count(200) <= 3  # one computing + two queued
    for r in replies:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "2"
            assert "queue is full" in r.json()["detail"]
    assert metrics["rejected_overload"] == statuses.count(503)
    assert metrics["errors"]["503"] == statuses.count(503)
    assert metrics["queue_depth"] == 0


def test_health_reports_corpus_index_encoder_and_batching(server: RetrievalServer) -> None:
    health = httpx.get(f"{server.base_url}/health").json()
    assert health["status"] == "healthy"
    assert health["corpus_size"] == CORPUS_SIZE
    assert health["index"] == {"type": "flat", "metric": "ip", "ntotal": CORPUS_SIZE, "devices": ["cpu"],
                               "backend": "faiss"}
    assert health["encoder"]["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert health["encoder"]["dim"] == 384
    assert health["batching"]["max_batch_size"] == 128
    assert health["limits"]["max_body_bytes"] == 65536
    assert health["auth"] is False


async def test_metrics_count_requests_errors_latency_and_queue(fresh) -> None:
    srv = fresh()
    async with httpx.AsyncClient(base_url=srv.base_url) as client:
        for q in ("alpha", "beta", "alpha"):
            assert (await client.post("/retrieve", json={"query": q})).status_code == 200
        assert (await client.post("/retrieve", json={"query": ""})).status_code == 422
        assert (await client.post("/retrieve", content=b"{")).status_code == 400
        m = (await client.get("/metrics")).json()
    assert m["requests"]["retrieve"] == 5
    assert m["errors"] == {"400": 1, "422": 1}
    assert m["queries"] == 3
    assert m["latency_ms"]["count"] == 3
    assert 0 < m["latency_ms"]["p50"] <= m["latency_ms"]["p95"] <= m["latency_ms"]["p99"]
    assert m["queue_depth"] == 0 and m["computing"] == 0
    assert m["cache"]["hits"] == 1 and m["cache"]["hit_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert m["batches"]["histogram"] == {"1": 2}


def test_bearer_token_guards_everything_but_health(fresh) -> None:
    srv = fresh(ServerSettings(token="s3cret"))
    url = srv.base_url
    missing = httpx.post(f"{url}/retrieve", json={"query": "film"})
    assert missing.status_code == 401 and "missing bearer token" in missing.json()["detail"]
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.post(f"{url}/retrieve", json={"query": "film"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["detail"]
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/stats").status_code == 401
    ok = httpx.post(f"{url}/retrieve", json={"query": "film"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert httpx.get(f"{url}/health").json()["auth"] is True


def test_openapi_schema_documents_the_routes(server: RetrievalServer) -> None:
    schema = httpx.get(f"{server.base_url}/openapi.json").json()
    retrieve = schema["paths"]["/retrieve"]["post"]
    body = retrieve["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"query", "top_k", "k"} and body["required"] == ["query"]
    assert body["properties"]["top_k"]["default"] == 10 and body["additionalProperties"] is False
    assert {"/batch_retrieve", "/health", "/metrics", "/stats"} <= set(schema["paths"])


def test_shutdown_finishes_requests_in_flight(retriever: Retriever) -> None:
    slow = SlowRetriever(retriever, 0.8)
    srv = RetrievalServer(slow).start()
    url = srv.base_url
    replies: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: replies.append(httpx.post(f"{url}/retrieve", json={"query": "film"},
                                                                       timeout=30)))
    worker.start()
    deadline = time.monotonic() + 10
    while not slow.batches:  # the request is being computed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    srv.stop()
    worker.join(10)
    assert replies and replies[0].status_code == 200
    assert replies[0].json()["results"]
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/retrieve", json={"query": "film"})


def test_token_comes_from_retrieval_token_with_rag_token_a_deprecated_alias(caplog) -> None:
    from rag.server import token_from_env

    assert token_from_env({}) is None
    assert token_from_env({"RETRIEVAL_TOKEN": "tok"}) == "tok"
    with caplog.at_level("WARNING", logger="rag.server"):
        assert token_from_env({"RAG_TOKEN": "old"}) == "old"
    assert "RAG_TOKEN is deprecated: set RETRIEVAL_TOKEN" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rag.server"):
        assert token_from_env({"RETRIEVAL_TOKEN": "new", "RAG_TOKEN": "old"}) == "new"
    assert "RAG_TOKEN differs from RETRIEVAL_TOKEN and is ignored" in caplog.text


# ----------------------------------------------------------------------------- rLLM's wire format
# Written from the request and response shapes of rLLM's examples/strands/rag/rag_server.py and its client
# examples/strands/retrieve_tool.py (commit 94676225): the request is {"query", "top_k" = 10, "k" = null}, "k"
# overriding "top_k"; the answer is {"query", "method", "results": [{"id", "content", "score"}], "num_results"},
# where "content" is the passage (rLLM sends the corpus row; its client reads row["contents"] when it is an object,
# the string itself otherwise); GET /health says "healthy" with corpus_size and index_type; GET /stats has the
# batching counters. Search-R1's wiki-18 corpus, which rLLM serves, has rows {id, contents: '"Title"\ntext'}.
WIKI_SIZE = 40


@pytest.fixture(scope="module")
def wiki_rows() -> list[dict[str, str]]:
    from rllm.data.hotpotqa import hotpotqa_paragraphs

    return [{"id": str(i), "contents": f'"{p["title"]}"\n{p["text"]}'}
            for i, p in enumerate(hotpotqa_paragraphs()[:WIKI_SIZE])]


@pytest.fixture(scope="module")
def wiki_server(tmp_path_factory: pytest.TempPathFactory, wiki_rows: list[dict[str, str]]) -> Iterator[RetrievalServer]:
    from rag.build_index import build_index
    from rag.corpus import write_jsonl
    from rag.encoder import MINILM

    out = tmp_path_factory.mktemp("wiki18-format")
    build_index(write_jsonl(wiki_rows, out / "corpus.jsonl"), out, encoder=MINILM, max_seq_length=128, progress=False)
    with RetrievalServer(Retriever.load(out)) as srv:
        yield srv


def _rllm_client_search(base_url: str, body: dict) -> tuple[dict, list[str]]:
    """What a client written for rLLM's server does: POST /retrieve, read each result's ``content``."""
    r = httpx.post(f"{base_url}/retrieve", json=body, timeout=60)
    r.raise_for_status()
    answer = r.json()
    texts = []
    for result in answer.get("results", []):
        content = result.get("content", "")
        texts.append(content.get("contents", "") if isinstance(content, dict) else content)
    return answer, texts


def test_a_client_written_for_rllms_server_reads_each_passages_text_unchanged(
        wiki_server: RetrievalServer, wiki_rows: list[dict[str, str]]) -> None:
    for row in (wiki_rows[0], wiki_rows[17], wiki_rows[39]):
        answer, texts = _rllm_client_search(wiki_server.base_url, {"query": row["contents"], "top_k": 5})
        assert texts[0] == row["contents"]  # the corpus text byte for byte, its '"Title"' line included
        assert len(texts) == 5 and all(texts)
        assert answer["num_results"] == 5 and answer["query"] == row["contents"]
        assert answer["method"] == "dense_batched"
        assert answer["results"][0]["id"] == row["id"]
        scores = [r["score"] for r in answer["results"]]
        assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)


def test_rllms_k_overrides_top_k_and_top_k_defaults_to_ten(wiki_server: RetrievalServer) -> None:
    query = "Who directed the 1983 fantasy film Krull?"
    assert len(_rllm_client_search(wiki_server.base_url, {"query": query, "top_k": 5, "k": 2})[1]) == 2
    assert len(_rllm_client_search(wiki_server.base_url, {"query": query, "k": 4})[1]) == 4
    assert len(_rllm_client_search(wiki_server.base_url, {"query": query, "k": None, "top_k": 3})[1]) == 3
    answer, texts = _rllm_client_search(wiki_server.base_url, {"query": query})
    assert len(texts) == 10 and answer["top_k"] == 10 and answer["num_results"] == 10


def test_our_own_fields_come_beside_rllms(wiki_server: RetrievalServer, wiki_rows: list[dict[str, str]]) -> None:
    row = wiki_rows[5]
    hit = httpx.post(f"{wiki_server.base_url}/retrieve", json={"query": row["contents"], "top_k": 1}).json()["results"][0]
    title, text = row["contents"].split("\n", 1)
    assert hit == {"id": row["id"], "title": title.strip('"'), "contents": text, "content": row["contents"],
                   "score": hit["score"]}


def test_rllms_health_check_and_stats_read_what_they_expect(wiki_server: RetrievalServer) -> None:
    health = httpx.get(f"{wiki_server.base_url}/health").json()
    assert health["status"] == "healthy"
    assert health["corpus_size"] == WIKI_SIZE and health["index_type"] == "dense_cpu"
    assert health["index_loaded"] is True and health["gpu_available"] is False and health["num_gpus"] == 0
    assert health["embedding_device"] == "cpu"
    _rllm_client_search(wiki_server.base_url, {"query": "a question no one asked before", "top_k": 2})
    stats = httpx.get(f"{wiki_server.base_url}/stats").json()
    assert stats["total_batches"] >= 1 and stats["total_queries"] >= 1
    assert stats["avg_batch_size"] == pytest.approx(stats["total_queries"] / stats["total_batches"])
    assert stats["avg_throughput_qps"] > 0
    assert stats["max_batch_size"] == 128 and stats["batch_timeout_ms"] == 0
    assert set(health["stats"]) == set(stats)


def test_a_smaller_max_top_k_caps_the_default(fresh) -> None:
    srv = fresh(ServerSettings(max_top_k=4))
    r = httpx.post(f"{srv.base_url}/retrieve", json={"query": "Krull"})
    assert r.status_code == 200 and len(r.json()["results"]) == 4


# ----------------------------------------------------------------------------- the token on the command line
def test_help_names_the_token_variable_and_a_typed_token_works_but_warns_that_ps_shows_it(
        index_dir: Path, tmp_path: Path) -> None:
    import os
    import sys

    from rllm.errors import ServerStartError
    from rllm.processes import ServerProcess, free_port, log_tail

    env = {k: v for k, v in os.environ.items() if k not in {"RETRIEVAL_TOKEN", "RAG_TOKEN"}}
    helped = subprocess_run([sys.executable, "-m", "rag.server", "--help"], env)
    assert "RETRIEVAL_TOKEN" in " ".join(helped.split())

    port, log = free_port(), tmp_path / "server.log"
    process = ServerProcess([sys.executable, "-m", "rag.server", "--index-dir", str(index_dir), "--port", str(port),
                             "--token", "typed-s3cret", "--log-level", "warning"], log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{url}/health", timeout=120, interval=0.2)
        # About auth, not speed: the first query warms the encoder, seconds on a CPU busy with other tests.
        assert httpx.post(f"{url}/retrieve", json={"query": "Krull"}, timeout=60).status_code == 401
        ok = httpx.post(f"{url}/retrieve", json={"query": "Krull"}, headers={"Authorization": "Bearer typed-s3cret"},
                        timeout=60)
        assert ok.status_code == 200
    except ServerStartError as error:
        pytest.fail(f"server did not come up: {error}\n{log_tail(log, 40)}")
    finally:
        process.stop()
    warnings = [line for line in log.read_text().splitlines() if "--token" in line]
    assert len(warnings) == 1, log.read_text()
    assert "ps" in warnings[0] and "RETRIEVAL_TOKEN" in warnings[0] and "typed-s3cret" not in warnings[0]


def subprocess_run(command: list[str], env: dict[str, str]) -> str:
    """Run ``command`` to completion and return its standard output."""
    import subprocess

    return subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
