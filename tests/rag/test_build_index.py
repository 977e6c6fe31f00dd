"""Corpus offsets, the manifest, and ``rag.build_index`` (resumable shards, flat / IVF / HNSW) with real MiniLM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rag.build_index import build_index
from rag.corpus import Corpus, to_passage
from rag.encoder import MINILM, Encoder, resolve_encoder
from rag.manifest import Manifest
from rag.retriever import Retriever

pytestmark = pytest.mark.timeout(120)

TOPICS = ["volcano eruption lava", "violin concerto orchestra", "football world cup final", "python programming",
          "mount everest climbing", "chocolate cake recipe", "solar eclipse moon", "stock market crash",
          "honey bees pollination", "medieval castle siege", "quantum computing qubits", "desert camel caravan"]


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(MINILM, max_seq_length=64)


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    rows = [{"id": f"doc{i}", "title": t.title(), "text": f"This passage is about {t}, number {i}."}
            for i, t in enumerate(TOPICS * 3)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_corpus_reads_both_row_shapes_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "\\"Aaron\\"\\nAaron is a prophet."}\n\n'
                    '{"id": "b", "title": "Bee", "text": "Bees make honey."}\r\n'
                    '  \n{"id": "c", "contents": "no title line"}')
    corpus = Corpus(path)
    assert len(corpus) == 3
    assert corpus[0] == {"id": "a", "title": "Aaron", "contents": "Aaron is a prophet."}
    assert corpus[1] == {"id": "b", "title": "Bee", "contents": "Bees make honey."}
    assert corpus[2] == {"id": "c", "title": "", "contents": "no title line"}
    with pytest.raises(IndexError, match="out of range"):
        corpus[3]
    corpus.close()
    # The offsets file is rebuilt when the corpus changes.
    path.write_text('{"id": "z", "text": "only one"}\n')
    os.utime(path, (path.stat().st_atime + 5, path.stat().st_mtime + 5))
    assert [p["id"] for p in (Corpus(path)[0],)] == ["z"] and len(Corpus(path)) == 1
    with pytest.raises(ValueError, match="neither 'contents' nor 'text'"):
        to_passage({"id": "x"}, 0)


def test_manifest_round_trip_and_missing_manifest(tmp_path: Path) -> None:
    m = Manifest(encoder="intfloat/e5-base-v2", query_prefix="query: ", passage_prefix="passage: ", dim=768,
                 doc_count=21_015_324, index_file="e5_Flat.index")
    m.save(tmp_path)
    assert Manifest.load(tmp_path) == m
    assert m.path(tmp_path, m.index_file) == tmp_path / "e5_Flat.index"
    with pytest.raises(FileNotFoundError, match="no manifest.json in .*rag.build_index"):
        Manifest.load(tmp_path / "nothing")


def test_minilm_resolves_to_the_packaged_model() -> None:
    path = Path(resolve_encoder("sentence-transformers/all-MiniLM-L6-v2"))
    assert (path / "model.safetensors").is_file()
    assert resolve_encoder("intfloat/e5-base-v2") == "intfloat/e5-base-v2"


def test_the_encoder_gives_sentence_transformers_own_minilm_embeddings() -> None:
    # Recorded from sentence-transformers itself (tests/rag/data/minilm_reference.py): a blank text, accents,
    # padding runs, a text past both token limits; with and without the manifest's normalisation.
    reference = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text(encoding="utf-8"))
    for i, case in enumerate(reference["cases"]):
        for trace in (None, False) if i == 0 else (None,):
            encoder = Encoder(MINILM, max_seq_length=case["max_seq_length"], normalize=case["normalize"], trace=trace)
            assert encoder.traced is (trace is None) and encoder.max_seq_length == (case["max_seq_length"] or 256)
            np.testing.assert_allclose(encoder.encode_passages(reference["texts"], batch_size=3), case["vectors"],
                                       atol=1e-5, err_msg=f"{case['max_seq_length']=} {case['normalize']=} {trace=}")


def _minilm_copy(tmp_path: Path, modules: list[dict] | None) -> Path:
    """The packaged MiniLM folder, its files linked, with ``modules`` as its modules.json (None: none)."""
    source = Path(resolve_encoder(MINILM))
    folder = tmp_path / "minilm"
    folder.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != "modules.json":
            (folder / path.name).symlink_to(path)
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    return folder


def test_a_plain_transformers_folder_is_mean_pooled_and_a_stage_the_encoder_cannot_run_is_named(
        tmp_path: Path, encoder: Encoder) -> None:
    from rag.errors import EncoderLayoutError

    plain = Encoder(str(_minilm_copy(tmp_path / "plain", None)), max_seq_length=64)
    np.testing.assert_allclose(plain.encode_queries(TOPICS), encoder.encode_queries(TOPICS), atol=1e-6)
    stages = json.loads((Path(resolve_encoder(MINILM)) / "modules.json").read_text(encoding="utf-8"))
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    with pytest.raises(EncoderLayoutError, match="has a 'sentence_transformers.models.Dense' stage where rag runs"):
        Encoder(str(_minilm_copy(tmp_path / "dense", [*stages[:2], dense])))


def test_sub_batched_query_encoding_gives_the_vectors_of_one_forward(encoder: Encoder) -> None:
    # Queries of very different lengths: one forward pads all of them to the longest, sub-batches do not.
    queries = [t if i % 3 else " ".join([t] * (1 + i % 7)) for i, t in enumerate(TOPICS * 2)]
    whole = encoder.encode_queries(queries)
    sub = Encoder(MINILM, max_seq_length=64, query_batch_size=4)
    assert sub.query_batch_size == 4
    np.testing.assert_allclose(sub.encode_queries(queries), whole, atol=2e-5)
    with pytest.raises(ValueError, match="query_batch_size must be at least 1"):
        Encoder(MINILM, query_batch_size=0)


@pytest.mark.parametrize("piece", [None, 7])
def test_traced_encoder_gives_the_eager_vectors_at_shapes_it_was_not_traced_with(
        encoder: Encoder, piece: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import rag.encoder

    if piece:  # a call longer than what is tokenized at once: it goes piece by piece, rows still in order
        monkeypatch.setattr(rag.encoder, "_TOKENIZE_TEXTS", piece)
    eager = Encoder(MINILM, max_seq_length=64, trace=False)
    assert encoder.traced and not eager.traced  # CPU default: traced
    long = " ".join(TOPICS)  # past max_seq_length: truncated at 64 tokens
    for queries in (["x"], TOPICS[:5], [long, "y", TOPICS[3]], [f"{t} {i}" for i, t in enumerate(TOPICS * 5)]):
        np.testing.assert_allclose(encoder.encode_queries(queries), eager.encode_queries(queries), atol=1e-6)
    passages = [f"This passage is about {t}." * (1 + i % 4) for i, t in enumerate(TOPICS)]
    np.testing.assert_allclose(encoder.encode_passages(passages, batch_size=5), eager.encode_passages(passages),
                               atol=1e-6)


def test_a_batch_is_cut_into_forwards_only_where_the_padding_saved_is_worth_a_forward() -> None:
    from rag.encoder import _forward_runs

    # One long text among short ones: padding nine texts of 10 to 40 tokens costs 270 tokens, a second
    # forward 16; like lengths stay in one forward; a forward never takes more than the cap.
    assert _forward_runs([40] + [10] * 9, cap=16, fixed=16) == [(0, 1), (1, 10)]
    assert _forward_runs([12, 12, 11, 11, 11, 10], cap=16, fixed=16) == [(0, 6)]
    runs = _forward_runs([10] * 40, cap=16, fixed=16)
    assert len(runs) == 3 and all(stop - start <= 16 for start, stop in runs)
    assert [r[0] for r in runs[1:]] == [r[1] for r in runs[:-1]] and runs[0][0] == 0 and runs[-1][1] == 40
    assert _forward_runs([], cap=16) == []


def test_a_trace_that_fails_or_differs_leaves_the_encoder_eager(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    import torch

    real_trace = torch.jit.trace

    def off_by_a_little(module, **kwargs):  # a trace that bakes in something wrong
        traced = real_trace(module, **kwargs)

        class Shifted(torch.nn.Module):
            def forward(self, *inputs):
                return traced(*inputs) + 1e-3
        return Shifted()

    monkeypatch.setattr(torch.jit, "trace", off_by_a_little)
    with caplog.at_level("WARNING", logger="rag.encoder"):
        shifted = Encoder(MINILM, max_seq_length=64, replicas=2)
    assert not shifted.traced
    assert "runs eager" in caplog.text and "the trace differs from the eager forward by" in caplog.text
    np.testing.assert_allclose(shifted.encode_queries(TOPICS), Encoder(MINILM, max_seq_length=64, trace=False)
                               .encode_queries(TOPICS), atol=1e-6)

    def cannot(module, **kwargs):
        raise RuntimeError("unsupported op")

    monkeypatch.setattr(torch.jit, "trace", cannot)
    caplog.clear()
    with caplog.at_level("WARNING", logger="rag.encoder"):
        assert not Encoder(MINILM, max_seq_length=64).traced
    assert "tracing failed: RuntimeError: unsupported op" in caplog.text


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_built_index_finds_each_passage_by_its_text(tmp_path: Path, corpus_file: Path, encoder: Encoder,
                                                     kind: str) -> None:
    out = tmp_path / kind
    m = build_index(corpus_file, out, index_type=kind, nlist=4, query_prefix="query: ", passage_prefix="passage: ",
                    max_seq_length=64, progress=False, model=encoder)
    assert (m.index_type, m.doc_count, m.dim, m.query_prefix) == (kind, 36, 384, "query: ")
    assert not (out / "embeddings").exists()
    r = Retriever.load(out, threads=None)
    hits = r.search([f"This passage is about {TOPICS[5]}, number 5."], 3)[0]
    assert hits[0]["id"] == "doc5" and hits[0]["title"] == "Chocolate Cake Recipe"
    assert r.describe()["index"]["type"] == kind
    assert r.describe()["encoder"]["query_batch_size"] == 16  # CPU default, traced: length-sorted forwards of 16
    assert r.describe()["encoder"]["traced"]


class _Flaky:
    """The real encoder, failing once after ``fail_after`` calls (an interrupted build)."""

    def __init__(self, inner: Encoder, fail_after: int) -> None:
        self.inner, self.fail_after, self.calls = inner, fail_after, 0
        self.dim = inner.dim

    def encode_passages(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_after + 1:
            raise KeyboardInterrupt("interrupted")
        return self.inner.encode_passages(texts, batch_size)


def test_interrupted_build_resumes_at_the_first_missing_shard(tmp_path: Path, corpus_file: Path,
                                                               encoder: Encoder) -> None:
    out = tmp_path / "idx"
    flaky = _Flaky(encoder, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus_file, out, shard_size=10, batch_size=10, progress=False, model=flaky)
    assert sorted(p.name for p in (out / "embeddings").glob("part-*.npy")) == ["part-00000.npy", "part-00001.npy"]
    assert not (out / "manifest.json").exists()

    resumed = _Flaky(encoder, fail_after=99)
    build_index(corpus_file, out, shard_size=10, batch_size=10, progress=False, model=resumed)
    assert resumed.calls == 2  # shards 2 and 3 only
    r = Retriever.load(out)
    assert r.search([f"This passage is about {TOPICS[1]}, number 25."], 1)[0][0]["id"] == "doc25"

    with pytest.raises(ValueError, match="other settings"):
        (out / "embeddings").mkdir()
        (out / "embeddings" / "build.json").write_text(json.dumps({"encoder": "other"}))
        build_index(corpus_file, out, shard_size=10, progress=False, model=encoder)


def _build_cli(*args: str, tmp_path: Path) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # offline: no hub retries, the same error a machine without hub sees
    return subprocess.run([sys.executable, "-m", "rag.build_index", *args, "--out", str(tmp_path / "idx")],
                          capture_output=True, text=True, env=env, timeout=120)


def test_build_index_cli_without_its_corpus_says_so_in_one_line(tmp_path: Path) -> None:
    run = _build_cli("--corpus", str(tmp_path / "missing.jsonl"), tmp_path=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "does not exist" in run.stderr.strip().splitlines()[-1]


def test_build_index_cli_with_an_unfetchable_encoder_says_so_in_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "a passage"}\n')
    run = _build_cli("--corpus", str(corpus), "--encoder", "intfloat/e5-base-v2", tmp_path=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("rag.build_index: error: encoder 'intfloat/e5-base-v2' cannot be loaded")


def test_two_workers_search_side_by_side_with_the_answers_of_one(tmp_path: Path, corpus_file: Path,
                                                                 encoder: Encoder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path / "idx"
    build_index(corpus_file, out, max_seq_length=64, progress=False, model=encoder)
    r = Retriever.load(out, workers=2)
    assert r.workers == 2 and r.describe()["workers"] == 2
    batches = [[f"This passage is about {t}, number {i}."] * 3 for i, t in enumerate(TOPICS)]
    serial = [r.search(b, 2) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda b: r.search(b, 2), batches * 3))
    assert parallel == serial * 3
    assert [s[0][0]["id"] for s in serial] == [f"doc{i}" for i in range(len(TOPICS))]


def test_faiss_threads_apply_in_the_thread_that_searches(tmp_path: Path, corpus_file: Path, encoder: Encoder) -> None:
    import subprocess
    import sys

    out = tmp_path / "idx"
    build_index(corpus_file, out, max_seq_length=64, progress=False, model=encoder)
    # A fresh process with FAISS loaded before torch (the server's order), so FAISS has its own OpenMP runtime:
    # its thread count is per thread, and set only where the index was loaded a worker would use every core.
    code = f"""
import threading, faiss
from rag.retriever import Retriever
r = Retriever.load({str(out)!r}, threads=1)
seen = []
def search():
    r.search(["honey bees"], 1)
    seen.append(faiss.omp_get_max_threads())
worker = threading.Thread(target=search)
worker.start()
worker.join()
print("threads in the worker:", seen[0])
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "", "TOKENIZERS_PARALLELISM": "false"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "threads in the worker: 1" in run.stdout
