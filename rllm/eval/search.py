"""Evaluate the Strands HotpotQA search agent through ``AgentWorkflowEngine``.

A Strands agent with the ``local_search`` retrieval tool answers HotpotQA questions in
``\\boxed{}``; every (question, rollout) runs concurrently, episodes stream to JSONL (a rerun
resumes), and the report gives exact match, F1, pass@k, mean turns and tool calls, and the
termination reasons (infrastructure failures apart, never scored as wrong).

The model, one of:
    --scripted                         an embedded scripted model (search once, copy the top title)
    --base-url URL --model NAME        any OpenAI-compatible endpoint (add --vllm for token ids)
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
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from rllm.agents.search import DEFAULT_SEARCH_BUDGET, scripted_search_reply, search_workflow_args
from rllm.data.hotpotqa import load_hotpotqa
from rllm.engine.rollout import OpenAIEngine
from rllm.errors import (
    InfrastructureFailureRateError,
    ModelUnreachableError,
    ServerStartError,
    SetupError,
    SystemicFailureError,
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
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
TINY_MODEL_HINT = (
    "python -c \"from pathlib import Path; from rllm.testing.tiny_models import build_tiny_model_dir; "
    "build_tiny_model_dir(Path('/tmp/tiny-qwen3'))\""
)


# ---------------------------------------------------------------------------------------- model
def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0].removeprefix("Got: ")


def resolve_model(name_or_path: str) -> str:
    """A local directory for ``name_or_path``: the directory itself, or the hub snapshot (downloaded once).

    Raises ``SetupError`` with a one-paragraph explanation when the hub cannot be reached and the
    model is not cached, or when the name or directory does not exist.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1:
        raise SetupError(f"--model {name_or_path}: no such directory. Give a local model directory (config.json, "
                         f"weights and tokenizer), or a Hugging Face hub name such as {DEFAULT_MODEL}.")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                               "*.jinja", "tokenizer*"])
    except (LocalEntryNotFoundError, httpx.HTTPError, ConnectionError) as error:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            why = "hub access is switched off (HF_HUB_OFFLINE=1)"
        else:
            why = f"the Hugging Face hub cannot be reached from this machine ({_first_line(error)})"
        raise ModelUnreachableError(
            f"The model {name_or_path} could not be fetched: {why} and the model is not in the local cache "
            f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}). Pass a local model directory with "
            f"--model PATH (a directory with config.json, the weights and the tokenizer, e.g. one saved by "
            f"save_pretrained or downloaded elsewhere with `hf download {name_or_path}`), or an "
            f"OpenAI-compatible endpoint with --base-url URL --model NAME, or add --scripted to watch the loop "
            f"with a scripted model. A tiny random model for a smoke test: {TINY_MODEL_HINT}",
            why,
        ) from None
    except (RepositoryNotFoundError, HFValidationError) as error:
        raise SetupError(f"--model {name_or_path}: not a model on the Hugging Face hub ({_first_line(error)})."
                         " Give a hub name such as Qwen/Qwen3-0.6B or a local directory.") from None


@contextlib.contextmanager
def rollout_engine(args: argparse.Namespace, model_path: str | None = None) -> Iterator[tuple[Any, str]]:
    """The rollout engine the arguments ask for, and a one-line description of it.

    ``model_path`` is the resolved local directory of ``--model`` when it runs in process.
    """
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    if args.scripted:
        from rllm.testing.scripted_server import ScriptedOpenAIServer

        server = ScriptedOpenAIServer(scripted_search_reply).start()
        try:
            yield OpenAIEngine("scripted", server.base_url, max_retries=2), "scripted (search, copy a title)"
        finally:
            server.stop()
        return
    if args.base_url:
        yield (OpenAIEngine(args.model, args.base_url, args.api_key, return_token_ids=args.vllm, **sampling),
               f"{args.model} at {args.base_url}")
        return
    from rllm.engine.rollout.transformers_engine import TransformersEngine

    name = args.model or DEFAULT_MODEL
    path = model_path or resolve_model(name)
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        engine = TransformersEngine(path, device=device, tool_parser="hermes",
                                    chat_template_kwargs={"enable_thinking": args.thinking}, **sampling)
    except (OSError, ValueError) as error:
        raise SetupError(f"--model {name}: could not load a causal LM and its tokenizer from {path} "
                         f"({_first_line(error)}).") from None
    if getattr(args, "random_weights", False):
        name = RANDOM_WEIGHTS_LABEL
    yield engine, f"{name} (transformers, {device})"


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


RANDOM_WEIGHTS_LABEL = "random-weight Qwen3 (plumbing only: random weights, real Qwen tokenizer and chat template)"


def _random_weight_fallback(args: argparse.Namespace, error: ModelUnreachableError, console: Console) -> str:
    """Say in one line that the default model cannot be had, and build the small random-weight Qwen3 instead."""
    from rllm.testing.tiny_models import build_random_qwen3_dir

    console.print(f"{DEFAULT_MODEL} cannot be fetched: {error.why}. Running the same pipeline on a small "
                  f"{RANDOM_WEIGHTS_LABEL}.", highlight=False)
    args.random_weights = True
    return str(build_random_qwen3_dir())


def check_reachable(url: str, path: str, what: str, timeout: float = 5.0) -> None:
    """Raise ``SetupError`` when nothing answers at ``url`` (any HTTP status counts as an answer).

    Checked before any work starts, so a wrong or dead URL costs one line and a few seconds
    instead of every rollout's retries.
    """
    try:
        httpx.get(url.rstrip("/") + path, timeout=timeout)
    except httpx.HTTPError as error:
        raise SetupError(f"{what} at {url} is unreachable ({type(error).__name__}: {error or 'no answer'}); "
                         f"start it or fix the URL") from error


def _url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, or None when it is."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"{url!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:30000/v1)"
    return None


@contextlib.contextmanager
def model_and_retrieval(args: argparse.Namespace, log_path: Path, console: Console) -> Iterator[tuple[Any, str, str]]:
    """The rollout engine, its description and the retrieval URL, for the duration of a run.

    A missing model fails first, before anything starts; the embedded retrieval server (unless
    ``--retrieval-url`` names one) boots while the model loads, and is stopped on exit.
    """
    local = not (args.scripted or args.base_url)
    model_path = None
    if local:
        try:
            model_path = resolve_model(args.model or DEFAULT_MODEL)
        except ModelUnreachableError as error:
            if args.model:
                raise
            model_path = _random_weight_fallback(args, error, console)
    if args.base_url:
        check_reachable(args.base_url, "/models", "model endpoint (--base-url)")
    if args.retrieval_url:
        check_reachable(args.retrieval_url, "/health", "retrieval server (--retrieval-url)")
    with contextlib.ExitStack() as stack:
        server = None
        if not args.retrieval_url:
            console.print("[dim]retrieval: starting the embedded HotpotQA index (built once on first use) ...[/dim]")
            server = stack.enter_context(RetrievalProcess(log_path, index_dir=args.index_dir))
        started = time.perf_counter()
        if local and not getattr(args, "random_weights", False):
            console.print(f"[dim]model: loading {args.model or DEFAULT_MODEL} ...[/dim]")
        engine, description = stack.enter_context(rollout_engine(args, model_path))
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
    try:
        with model_and_retrieval(args, log_path, console) as (engine, description, url):
            console.print(announce(description) + f", retrieval {url}", highlight=False)
            return asyncio.run(run_search_eval(args, engine, url, episodes_path))
    except SetupError as error:
        console.print(f"[bold red]error:[/bold red] {error}", highlight=False)
        return 2
    except (SystemicFailureError, InfrastructureFailureRateError) as error:
        console.print(f"[bold red]run stopped:[/bold red] {error}\nfinished episodes are kept in {episodes_path}",
                      highlight=False)
        return 1
    except KeyboardInterrupt:
        console.print(f"interrupted: finished episodes are kept in {episodes_path}; {resume_hint}")
        return 130


def add_model_arguments(parser: argparse.ArgumentParser, *, max_tokens: int) -> None:
    """The model, retrieval and sampling options shared by the eval and the quickstart."""
    model = parser.add_argument_group("model (default: Qwen/Qwen3-0.6B run locally with transformers)")
    model.add_argument("--model", default=None,
                       help="local model directory or hub name (run in process); with --base-url: the served name")
    model.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:30000/v1")
    model.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    model.add_argument("--vllm", action="store_true", help="ask a vLLM endpoint for token ids and logprobs")
    model.add_argument("--scripted", action="store_true", help="an embedded scripted model instead (offline demo)")
    model.add_argument("--device", default=None, help="for a local model: cpu or cuda (default: cuda if available)")
    model.add_argument("--thinking", action="store_true", help="let Qwen3 think (<think>) before answering")
    model.add_argument("--temperature", type=float, default=None,
                       help="sampling temperature (default: 0 for one rollout, 0.7 for several)")
    model.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per model turn")
    rag = parser.add_argument_group("retrieval (default: the embedded HotpotQA index)")
    rag.add_argument("--retrieval-url", default=None, help="use this running rag server instead")
    rag.add_argument("--index-dir", default=None, help="serve this index directory instead of the default one")


def check_model_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject contradictory model options and fill the temperature default."""
    if args.scripted and (args.base_url or args.model):
        parser.error("--scripted replaces the model; drop --model / --base-url")
    if args.base_url and not args.model:
        parser.error("--base-url needs --model NAME (the model name the endpoint serves)")
    for option, url in (("--base-url", args.base_url), ("--retrieval-url", args.retrieval_url)):
        problem = url and _url_problem(url)
        if problem:
            parser.error(f"{option}: {problem}")
    if args.temperature is None:
        args.temperature = 0.0 if args.rollouts == 1 else 0.7
    args.random_weights = False


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-60:] or "model"


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; exit status 0 on success, 2 on a set-up problem, 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, max_tokens=1024)
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
    args = parser.parse_args(argv)
    check_model_arguments(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()

    name = "scripted" if args.scripted else (args.model or DEFAULT_MODEL)
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
