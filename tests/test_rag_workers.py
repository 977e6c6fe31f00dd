"""Search in worker processes (``rag.workers.ProcessRetriever``) on a real MiniLM index: same answers, clear failures."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rag.retriever import Retriever
from rag.testing import demo_index
from rag.workers import ProcessRetriever
from rllm.errors import SearchWorkerError

pytestmark = pytest.mark.timeout(180)

QUERIES = ["Who directed the film Krull?", "Which band released the album Nevermind?",
           "What is the capital of the country where the Danube ends?", "Scott Derrickson nationality"]


def _ids(answers: list[list[dict]]) -> list[list[str]]:
    return [[hit["id"] for hit in hits] for hits in answers]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_index(tmp_path_factory.getbasetemp(), 200)


def test_worker_processes_answer_as_the_retriever_in_process_does(index_dir: Path) -> None:
    expected = Retriever.load(index_dir).search(QUERIES, 3)
    workers = ProcessRetriever.start(index_dir, workers=2)
    try:
        assert workers.workers == 2
        health = workers.describe()
        assert (health["workers"], health["compute"], health["corpus_size"]) == (2, "processes", 200)
        with ThreadPoolExecutor(4) as pool:  # more callers than workers: they wait for a free one
            answers = list(pool.map(lambda q: workers.search([q], 3)[0], QUERIES * 3))
        assert _ids(answers) == _ids(expected * 3)  # one query alone vs four padded together: scores differ ~1e-7
        assert workers.search(QUERIES, 3) == expected
        assert workers.search([], 3) == []
    finally:
        workers.close()
    with pytest.raises(SearchWorkerError, match="closed"):
        workers.search(QUERIES, 1)


def test_a_worker_that_dies_fails_its_batch_by_name_and_is_replaced(index_dir: Path) -> None:
    workers = ProcessRetriever.start(index_dir, workers=1)
    try:
        first = workers.search(QUERIES[:1], 1)
        workers._children[0].process.kill()
        workers._children[0].process.join(10)
        with pytest.raises(SearchWorkerError, match=r"search worker 0 exited \(code -9\).*a new one was started"):
            workers.search(QUERIES[:1], 1)
        assert workers.search(QUERIES[:1], 1) == first
    finally:
        workers.close()


def test_a_worker_that_cannot_load_the_index_says_why(tmp_path: Path) -> None:
    with pytest.raises(SearchWorkerError, match="search worker 0 failed to start: .*manifest"):
        ProcessRetriever.start(tmp_path / "no-index", workers=1)
