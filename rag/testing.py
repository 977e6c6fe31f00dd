"""An in-process retrieval server on 127.0.0.1 for tests, demos and notebooks.

Serve a real index and talk to it over HTTP:

    with RetrievalServer(Retriever.load(demo_index(tmp_dir))) as server:
        client = RetrievalClient(server.base_url)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rag.server import RetrieverLike, ServerSettings, create_app
from rllm.offline.uvicorn_thread import UvicornThread


class RetrievalServer:
    """Serve a retriever from a uvicorn thread; ``stop`` is a graceful shutdown (in-flight requests finish)."""

    def __init__(self, retriever: RetrieverLike | str | Path, settings: ServerSettings | None = None) -> None:
        if isinstance(retriever, (str, Path)):
            from rag.retriever import Retriever

            retriever = Retriever.load(retriever)
        self.settings = settings or ServerSettings()
        self.app = create_app(retriever, self.settings)
        self._http = UvicornThread(self.app, name="rag-server", backlog=4096,
                                   timeout_graceful_shutdown=int(self.settings.drain_timeout))

    @property
    def port(self) -> int | None:
        return self._http.port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._http.port is None:
            raise RuntimeError("RetrievalServer is not started")
        return f"http://127.0.0.1:{self._http.port}"

    def start(self, timeout: float = 10.0) -> RetrievalServer:
        """Bind a free port, serve in a daemon thread, return once it accepts requests."""
        self._http.start(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, finish requests in flight, join the thread; safe to call twice."""
        self._http.stop(timeout)

    def __enter__(self) -> RetrievalServer:
        return self if self._http.running else self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()


def demo_index(root: str | Path, limit: int = 200, max_seq_length: int | None = 128) -> Path:
    """A MiniLM index over the first ``limit`` shipped HotpotQA paragraphs under ``root``, built once.

    Passages are cut at ``max_seq_length`` tokens (128 keeps test builds quick).
    """
    from rag.build_index import build_demo_index
    from rag.manifest import Manifest

    out = Path(root) / f"hotpotqa-minilm-{limit}-{max_seq_length}"
    if not (out / "manifest.json").is_file() or Manifest.load(out).doc_count != limit:
        build_demo_index(out, limit=limit, max_seq_length=max_seq_length, progress=False)
    return out


class SlowRetriever:
    """Wraps a retriever and sleeps before each batch: makes overload and shutdown observable in tests."""

    def __init__(self, inner: RetrieverLike, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.batches: list[list[str]] = []

    def search(self, queries: list[str], top_k: int) -> list[list[dict[str, Any]]]:
        self.batches.append(list(queries))
        time.sleep(self.delay)
        return self.inner.search(queries, top_k)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()
