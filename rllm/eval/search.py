r"""Evaluate the Strands HotpotQA search agent through ``AgentWorkflowEngine``.

A Strands agent with the ``local_search`` retrieval tool answers HotpotQA questions in
``\boxed{}``; every (question, rollout) runs concurrently, episodes stream to JSONL (a rerun
resumes), and the report gives exact match, F1, pass@k, mean turns and tool calls, and the
termination reasons (infrastructure failures apart, never scored as wrong).

The model (``rllm.eval.models``, shared with the GAIA eval), one of:
    --scripted                         an embedded scripted model (search once, copy the top title)
    --base-url URL --model NAME        any OpenAI-compatible endpoint (add --vllm for token ids);
                                       its key from $OPENAI_API_KEY
    --model PATH_OR_HUB_NAME           a local Hugging Face model run in process (TransformersEngine)

Retrieval: --retrieval-url URL, or by default the embedded index over the shipped HotpotQA
paragraphs, started (and built once) with rag/launch_rag.sh and stopped at the end.

    python examples/strands/search_agent_strands.py --scripted --n 20
    python examples/strands/search_agent_strands.py --base-url http://127.0.0.1:30000/v1 \
        --model Qwen/Qwen3-4B --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from rllm.agents.search import DEFAULT_SEARCH_BUDGET, scripted_search_reply, search_workflow_args
from rllm.data.hotpotqa import load_hotpotqa
from rllm.errors import ServerStartError, SetupError
from rllm.eval.exit_codes import stopped_runs
from rllm.eval.models import (
    add_model_arguments,
    check_model_arguments,
    check_reachable,
    choose_model,
    open_engine,
    url_problem,
)
from rllm.eval.reports import print_report, search_report
from rllm.integrations.strands import Budget
from rllm.processes import ServerProcess, free_port, log_tail
from rllm.types import Episode
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow

logger = logging.getLogger("search_agent")

RUNS_DIR = Path("runs")
"""Where runs write by default, relative to the working directory (the clone's root in the README)."""
LAUNCH_RAG = importlib.resources.files("rag") / "launch_rag.sh"
"""The retrieval launcher, package data of ``rag``: found in a normal install as in a clone."""


# ------------------------------------------------------------------------------------ retrieval
class RetrievalProcess:
    """``rag/launch_rag.sh`` in its own process group: started at once, awaited on demand, stopped on exit.

    It builds the default index on first use, then serves it (or ``index_dir``) on 127.0.0.1; its
    output goes to ``log_path``.
    """

    def __init__(self, log_path: Path, *, index_dir: str | None = None, port: int | None = None) -> None:
        self.url = f"http://127.0.0.1:{port or free_port()}"
        self.log_path = log_path
        env = {**os.environ, "PYTHON": sys.executable}
        command = ["bash", str(LAUNCH_RAG), index_dir or "default", self.url.rsplit(":", 1)[1]]
        self.server = ServerProcess(command, log_path, env=env)
        self.process = self.server.process

    def wait_ready(self, timeout: float = 900.0) -> dict[str, Any]:
        """Poll ``/health`` until it answers; ``SetupError`` with the log's tail if the server dies or times out."""
        try:
            return self.server.wait_ready(f"{self.url}/health", timeout).json()
        except ServerStartError as error:
            if error.returncode is not None:
                raise SetupError(f"the retrieval server exited with status {error.returncode} before it was "
                                 f"ready; last lines of {self.log_path}:\n"
                                 f"{log_tail(self.log_path, 15, '(no log)')}") from None
            raise SetupError(f"the retrieval server was not ready after {timeout:.0f}s; see {self.log_path}") from None

    def stop(self) -> None:
        """Stop the process group (the launcher, an index build, the server), politely first."""
        self.server.stop(timeout=30)

    def __enter__(self) -> RetrievalProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def model_and_retrieval(args: argparse.Namespace, log_path: Path, console: Console) -> Iterator[tuple[Any, str, str]]:
    """The rollout engine, its description and the retrieval URL, for the duration of a run.

    A missing model fails first, before anything starts; the embedded retrieval server (unless
    ``--retrieval-url`` names one) boots while the model loads, and is stopped on exit.
    """
    choice = choose_model(args, console)
    args.random_weights = choice.random_weights
    if args.retrieval_url:
        check_reachable(args.retrieval_url, "/health", "retrieval server (--retrieval-url)")
    with contextlib.ExitStack() as stack:
        server = None
        if not args.retrieval_url:
            console.print("[dim]retrieval: starting the embedded HotpotQA index (built once on first use) ...[/dim]")
            server = stack.enter_context(RetrievalProcess(log_path, index_dir=args.index_dir))
        started = time.perf_counter()
        if choice.kind == "local" and not choice.random_weights:
            console.print(f"[dim]model: loading {choice.name} ...[/dim]")
        engine, description = stack.enter_context(open_engine(args, choice, scripted_search_reply,
                                                              "scripted (search, copy a title)"))
        url = args.retrieval_url
        if server is not None:
            health = server.wait_ready()
            url = server.url
            console.print(f"[dim]retrieval: {health.get('corpus_size', '?')} passages at {url}, ready in "
                          f"{time.perf_counter() - started:.1f}s (log: {log_path})[/dim]")
        yield engine, description, url


# ------------------------------------------------------------------------------------------- run
async def run_search_eval(args: argparse.Namespace, engine: Any, url: str, output_path: Path) -> list[Episode]:
    """Run the search agent on the selected HotpotQA tasks through ``AgentWorkflowEngine``."""
    tasks = load_hotpotqa(args.data, limit=args.n)
    budget = Budget(max_model_turns=args.max_turns, max_tool_calls=args.max_tool_calls)
    workflow_args = search_workflow_args(url, budget=budget, partial_credit=args.partial_credit)
    runner = AgentWorkflowEngine(StrandsWorkflow, workflow_args, engine, n_parallel_tasks=args.parallel,
                                 retry_limit=args.retry_limit, rollout_timeout=args.timeout,
                                 output_path=output_path, progress=not args.no_progress)
    try:
        return await runner.execute_tasks(tasks, n_rollouts=args.rollouts)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            await close()


def run_search_cli(args: argparse.Namespace, console: Console, log_path: Path, episodes_path: Path,
                   announce: Callable[[str], str], *, resume_hint: str) -> list[Episode] | int:
    """Start the model and retrieval, run the search eval and return its episodes, or the exit status.

    2: a set-up problem (no model, no server); 1: the run stopped itself (the same error ended
    several rollouts, or too many failed on infrastructure), what finished kept; 130: Ctrl-C.
    """
    with stopped_runs(console, episodes_path, resume_hint) as end:
        with model_and_retrieval(args, log_path, console) as (engine, description, url):
            console.print(announce(description) + f", retrieval {url}", highlight=False)
            return asyncio.run(run_search_eval(args, engine, url, episodes_path))
    assert end.exit_code is not None
    return end.exit_code


def add_search_arguments(parser: argparse.ArgumentParser, *, max_tokens: int) -> None:
    """The model (``rllm.eval.models``), sampling and retrieval options shared by the eval and the quickstart."""
    add_model_arguments(parser, max_tokens=max_tokens)
    rag = parser.add_argument_group("retrieval (default: the embedded HotpotQA index)")
    rag.add_argument("--retrieval-url", default=None, help="use this running rag server instead")
    rag.add_argument("--index-dir", default=None, help="serve this index directory instead of the default one")


def check_search_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject contradictory model or retrieval options and fill the temperature default."""
    check_model_arguments(parser, args)
    problem = args.retrieval_url and url_problem(args.retrieval_url)
    if problem:
        parser.error(f"--retrieval-url: {problem}")
    if args.temperature is None:
        args.temperature = 0.0 if args.rollouts == 1 else 0.7
    args.random_weights = False


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-60:] or "model"


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; exit status 0 on success, 2 on a set-up problem, 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_search_arguments(parser, max_tokens=1024)
    run = parser.add_argument_group("evaluation")
    run.add_argument("--data", default=None, help="HotpotQA JSONL (default: the shipped 100-question dev sample)")
    run.add_argument("--n", type=int, default=None, help="first N questions (default: all)")
    run.add_argument("--rollouts", type=int, default=1, help="rollouts per question (pass@k up to this)")
    run.add_argument("--parallel", type=int, default=32, help="rollouts run at once")
    run.add_argument("--max-turns", type=int, default=DEFAULT_SEARCH_BUDGET.max_model_turns)
    run.add_argument("--max-tool-calls", type=int, default=DEFAULT_SEARCH_BUDGET.max_tool_calls)
    run.add_argument("--timeout", type=float, default=900.0, help="seconds per rollout attempt")
    run.add_argument("--retry-limit", type=int, default=3, help="reruns after an infrastructure failure")
    run.add_argument("--partial-credit", action="store_true", help="reward F1 for inexact answers")
    run.add_argument("--output-dir", type=Path, default=None,
                     help="where episodes.jsonl and report.json go (default: runs/hotpotqa/<model>); "
                          "a rerun with the same directory resumes")
    run.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming")
    run.add_argument("--no-progress", action="store_true")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    check_search_arguments(parser, args)
    console = Console()

    name = "scripted" if args.scripted else (args.model or args.default_model)
    out_dir = args.output_dir or RUNS_DIR / "hotpotqa" / _slug(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    episodes_path = out_dir / "episodes.jsonl"
    if args.overwrite:
        episodes_path.unlink(missing_ok=True)
    def announce(description: str) -> str:
        return f"model: {description}; temperature {args.temperature}; {args.rollouts} rollout(s) per question"

    episodes = run_search_cli(args, console, out_dir / "rag_server.log", episodes_path, announce,
                              resume_hint="rerun the same command to resume")
    if isinstance(episodes, int):
        return episodes
    report = search_report(episodes)
    print_report(report, console)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"episodes: {episodes_path}\nreport: {out_dir / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
