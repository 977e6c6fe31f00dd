"""The viewer's command: ``python -m rllm.viewer PATH [--port N] [--host 127.0.0.1]``, also ``rllm-view``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rllm.viewer.sources import NotServable, open_source

DEFAULT_PORT = 6007
"""The viewer's port unless told (TensorBoard's is 6006)."""


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    parse = argparse.ArgumentParser(
        prog="python -m rllm.viewer",
        description="Serve a training run directory or an AgentWorkflowEngine episodes JSONL to a browser: the run's "
                    "curves and steps, each step's or evaluation's episodes, an episode's conversation and tokens.")
    parse.add_argument("path", type=Path, help="a run directory (metrics.jsonl, rollouts/) or an episodes JSONL")
    parse.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    parse.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1: this machine only; the pages show your data)")
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """Serve PATH until interrupted; exit 2 naming PATH when it is neither a run directory nor an episodes file."""
    parse = parser()
    args = parse.parse_args(argv)
    try:
        source = open_source(args.path)
    except NotServable as error:
        parse.error(str(error))  # exits 2
    import uvicorn

    from rllm.viewer.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"rllm viewer: serving {args.path} at http://{args.host}:{args.port}/ (Ctrl-C stops)", flush=True)  # noqa: T201
    uvicorn.run(create_app(source), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
