"""The retrieval server's command line: ``python -m rag.server`` (``rag.server`` run as a script runs this module).

Parses the flags, checks the HTTP limits, loads the index in a thread that ends with the load, and
serves ``rag.server.create_app`` with granian (or uvicorn) until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from rag import server
from rag.client import TOKEN_ENV
from rag.errors import HttpConfigError
from rag.server import ServerSettings, create_app, token_from_env
from rag.serving import HttpLimits, granian_available, serve

logger = logging.getLogger(__name__)

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_SWITCH_INTERVAL_MS = 5.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag.server", description=(server.__doc__ or "").split("\n\n")[0])
    p.add_argument("--index-dir", required=True, help="directory with manifest.json, the index and the corpus")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=None,
                   help=f"bearer token required on every route but /health and the docs (default: the environment "
                        f"variable {TOKEN_ENV}, which the local_search tool reads too; none if unset). Prefer the "
                        f"variable: a token given here is shown by ps to every user of the machine")
    g = p.add_argument_group("index placement")
    g.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    g.add_argument("--gpus", default=None, help="comma-separated GPU ids (default: all visible)")
    g.add_argument("--replicate", action="store_true", help="copy the index to every GPU instead of sharding it")
    g.add_argument("--no-fp16", action="store_true", help="keep float32 vectors on the GPU")
    g.add_argument("--search-backend", choices=["auto", "faiss", "torch"], default="auto",
                   help="auto: faiss-gpu where it loads, else torch exact flat search on the GPUs; torch forces it")
    g.add_argument("--torch-chunk-mb", type=int, default=1024, help="torch search: score-matrix budget per chunk")
    g.add_argument("--temp-memory-mb", type=int, default=None, help="FAISS scratch memory per GPU")
    g.add_argument("--nprobe", type=int, default=None, help="IVF lists probed per query")
    g.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    g.add_argument("--mmap-index", action="store_true", help="memory-map a CPU index file instead of reading it")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the encoder and FAISS, per worker (default: all of them for a search "
                        "running alone, split between searches running side by side)")
    g.add_argument("--query-batch-size", type=int, default=None,
                   help="queries per encoder forward, sorted by length so each forward pads little (default: "
                        "16 on CPU, 32 with --no-trace-encoder, the whole batch on a GPU; 0: the whole batch)")
    g.add_argument("--workers", type=int, default=None,
                   help="batches computed side by side, each on its own thread with its share of the CPU threads "
                        "(default: 2 on a CPU with 2+ cores, 1 on a GPU)")
    g.add_argument("--trace-encoder", action=argparse.BooleanOptionalAction, default=None,
                   help="run the encoder's forward as a TorchScript trace, checked against the eager one at load "
                        "(default: on CPU, where it frees the GIL for the event loop; eager on a GPU)")
    g.add_argument("--switch-interval-ms", type=float, default=_SWITCH_INTERVAL_MS,
                   help="Python's GIL switch interval: how long the compute thread may wait for the GIL while "
                        "the event loop holds it, at every torch op boundary (Python's default is 5)")
    b = p.add_argument_group("batching and limits")
    defaults = ServerSettings()
    for name in ("max_batch_size", "max_queue", "cache_passages", "max_top_k", "max_query_chars",
                 "max_batch_queries", "max_body_bytes", "retry_after"):
        b.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    b.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout)
    h = p.add_argument_group("HTTP limits (slow, silent and oversized clients)")
    http = HttpLimits()
    h.add_argument("--http-server", choices=["granian", "uvicorn"], default="granian",
                   help="granian (default: header read timeout, bounded heads, connection cap) or uvicorn "
                        "(h11; no header read timeout)")
    h.add_argument("--header-timeout", type=float, default=http.header_timeout,
                   help="seconds to receive a complete request head; closes silent and idle connections too")
    h.add_argument("--body-timeout", type=float, default=defaults.body_timeout,
                   help="seconds to receive the whole body after the head (408 after)")
    h.add_argument("--max-header-bytes", type=int, default=http.max_header_bytes,
                   help="largest request head (431 above; at least 8192)")
    h.add_argument("--max-connections", type=int, default=http.max_connections,
                   help="connections served at once; more wait in the listen backlog")
    h.add_argument("--backlog", type=int, default=http.backlog, help="listen backlog")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request (slower)")
    return p


def _in_a_passing_thread(work: Callable[[], Any]) -> Any:
    """``work()`` run in a thread that ends with it.

    OpenMP (torch's and FAISS's) keeps a team of helper threads for every thread that ran a parallel
    region, for as long as that thread lives. Left on the main thread, which goes on as the event loop,
    the loading and warm-up's teams count against the cores, and libgomp then spins less before its
    helpers sleep: every lone query pays the wake-ups (~1.5 ms here). A thread's teams go with it.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-load") as pool:
        return pool.submit(work).result()


def main(argv: list[str] | None = None) -> None:
    """Load the index named on the command line and serve it until SIGINT/SIGTERM."""
    from rag.index import IndexOptions
    from rag.retriever import Retriever

    args = _parser().parse_args(argv)
    limits = HttpLimits(header_timeout=args.header_timeout, max_header_bytes=args.max_header_bytes,
                        max_connections=args.max_connections, backlog=args.backlog)
    try:
        limits.check()
    except HttpConfigError as e:
        _parser().error(str(e))
    if args.http_server == "granian" and not granian_available():
        _parser().error("granian is not installed (pip install -e '.[rag]'); or pass --http-server uvicorn")
    sys.setswitchinterval(args.switch_interval_ms / 1e3)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.token:
        logger.warning("--token puts the token in the process table, where any user of this machine sees it with ps; "
                       "set %s instead", TOKEN_ENV)
    options = IndexOptions(device=args.device, gpus=[int(g) for g in args.gpus.split(",")] if args.gpus else None,
                           shard=not args.replicate, fp16=not args.no_fp16, temp_memory_mb=args.temp_memory_mb,
                           nprobe=args.nprobe, ef_search=args.ef_search, threads=args.threads,
                           search_backend=args.search_backend, torch_chunk_mb=args.torch_chunk_mb)
    query_batch_size: int | None | Literal["auto"] = (
        "auto" if args.query_batch_size is None else args.query_batch_size or None)

    def load() -> Retriever:
        retriever = Retriever.load(args.index_dir, options, threads=args.threads, mmap_index=args.mmap_index,
                                   query_batch_size=query_batch_size,
                                   workers=args.workers or "auto", trace_encoder=args.trace_encoder)
        retriever.search(["warm-up query"], 1)
        return retriever

    retriever = _in_a_passing_thread(load)
    token = args.token or token_from_env()
    settings = ServerSettings(token=token, drain_timeout=args.drain_timeout, body_timeout=args.body_timeout, **{
        k: getattr(args, k) for k in ("max_batch_size", "max_queue", "cache_passages", "max_top_k", "max_query_chars",
                                      "max_batch_queries", "max_body_bytes", "retry_after")})
    if args.host not in _LOOPBACK and token is None:
        logger.warning("serving on %s without a bearer token: anyone who can reach the port can query", args.host)
    serve(create_app(retriever, settings), args.host, args.port, limits, server=args.http_server,
          log_level=args.log_level, access_log=args.access_log, drain_timeout=args.drain_timeout)



if __name__ == "__main__":
    main()
