"""The search-agent evaluation: the Strands HotpotQA search agent, end to end, in one command.

Starts the embedded retrieval server (MiniLM + FAISS over the shipped HotpotQA paragraphs, built
once), runs the search agent through ``AgentWorkflowEngine`` on the first questions of the shipped
HotpotQA sample, prints the accuracy, one trajectory and where the episodes are, and stops the
server. Run it through ``bash scripts/quickstart.sh --search`` (``examples/strands/quickstart_search.py``),
which picks the interpreter.

    bash scripts/quickstart.sh --search                              # Qwen/Qwen3-0.6B, run locally (fetched once)
    bash scripts/quickstart.sh --search --model /path/to/model       # any local Hugging Face model directory
    bash scripts/quickstart.sh --search --base-url http://127.0.0.1:30000/v1 --model Qwen/Qwen3-4B
    bash scripts/quickstart.sh --search --scripted                   # a scripted model: the loop, fully offline
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from rllm.eval.reports import format_trajectory, search_report
from rllm.eval.search import RUNS_DIR, add_search_arguments, check_search_arguments, run_search_cli
from rllm.types import Episode


def _sample(episodes: list[Episode]) -> Episode:
    """The episode to show: a correct one that searched, else one that searched, else the first."""
    for wanted in (lambda e: e.is_correct and e.metrics.get("tool_calls"), lambda e: e.metrics.get("tool_calls")):
        found = next((e for e in episodes if wanted(e)), None)
        if found is not None:
            return found
    return episodes[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_search_arguments(parser, max_tokens=512)
    run = parser.add_argument_group("run")
    run.add_argument("--n", type=int, default=5, help="questions from the shipped HotpotQA sample (default 5)")
    run.add_argument("--rollouts", type=int, default=1, help="rollouts per question")
    run.add_argument("--parallel", type=int, default=8, help="rollouts run at once")
    run.add_argument("--max-turns", type=int, default=6)
    run.add_argument("--max-tool-calls", type=int, default=8)
    run.add_argument("--timeout", type=float, default=900.0, help="seconds per rollout attempt")
    run.add_argument("--retry-limit", type=int, default=2)
    run.add_argument("--output-dir", type=Path, default=RUNS_DIR / "quickstart")
    run.add_argument("--resume", action="store_true",
                     help="keep the episodes of an earlier run and add the missing ones")
    run.add_argument("--no-progress", action="store_true")
    parser.set_defaults(data=None, partial_credit=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit status 0 on success, 2 on a set-up problem (no model, no server), 130 on Ctrl-C."""
    parser = _parser()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    check_search_arguments(parser, args)
    console = Console()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    episodes_path = args.output_dir / "episodes.jsonl"
    if not args.resume:
        episodes_path.unlink(missing_ok=True)

    def announce(description: str) -> str:
        return f"HotpotQA search agent: {args.n} question(s) x {args.rollouts} rollout(s), model {description}"

    episodes = run_search_cli(args, console, args.output_dir / "rag_server.log", episodes_path, announce,
                              resume_hint="rerun with --resume")
    if isinstance(episodes, int):
        return episodes

    report = search_report(episodes)
    console.print(Panel(format_trajectory(_sample(episodes), width=max(60, console.width - 4)),
                        title="sample trajectory", title_align="left"),
                  highlight=False)
    correct = sum(e.is_correct for e in episodes if e.termination_reason.is_scored)
    reasons = ", ".join(f"{reason} {count}" for reason, count in report["termination_reasons"].items())
    plumbing = "   (plumbing with random weights: the scores mean nothing)" if args.random_weights else ""
    console.print(f"accuracy (exact match): {correct}/{report['scored']} = {report['exact_match']:.3f}   "
                  f"F1 {report['f1']:.3f}   mean turns {report['mean_turns']:.1f}   "
                  f"mean searches {report['mean_tool_calls']:.1f}{plumbing}", highlight=False)
    console.print(f"termination: {reasons}" + (f"; {report['infrastructure_failures']} infrastructure failure(s), "
                                               "not scored" if report["infrastructure_failures"] else ""),
                  highlight=False)
    console.print(f"episodes written to {episodes_path}", highlight=False)
    console.print("full evaluation: python examples/strands/search_agent_strands.py --help", style="dim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
