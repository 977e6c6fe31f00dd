r"""Evaluate the GAIA agent (``rllm.agents.gaia``) through ``AgentWorkflowEngine``: run, score, report.

Each task runs in its own work directory holding a copy of its attachment, whose path is in the
prompt; the agent has a calculator, an HTTP tool (public addresses only), a file reader and a
Python runner confined to that directory. The Python runner works inside a bubblewrap sandbox;
where none can be had the run stops before it starts, unless ``--unsafe-python-exec`` accepts the
audit-hook guard alone (not a security boundary). The isolation in use is printed and recorded.
Answers are scored with GAIA's official rules (``rllm.rewards.gaia_reward``).
Written to ``--out``: ``episodes.jsonl`` (one episode per task, streamed; a rerun resumes),
``report.json``, ``summary.txt`` (the table printed at the end), ``accuracy.png`` (accuracy per
level) and ``submission.jsonl`` (GAIA leaderboard format). Infrastructure failures (engine
unreachable, timeouts) are reported apart and left out of accuracy.

The model options are the search eval's (``rllm.eval.models``): ``--base-url URL --model NAME``
(any OpenAI-compatible endpoint, its key from ``$OPENAI_API_KEY``; ``--vllm`` for token ids and
logprobs), ``--model PATH_OR_HUB_NAME`` (a local model run in process) or ``--scripted``.

    # the real benchmark, against any OpenAI-compatible endpoint
    python scripts/prepare_gaia.py --data-dir data/gaia            # needs an HF token with GAIA access
    python examples/strands/eval_gaia.py --data-dir data/gaia --base-url http://127.0.0.1:30000/v1 \
        --model Qwen/Qwen3-8B --level 1 --limit 20 --n-parallel 8 --out runs/gaia

    # offline: a scripted model on the demo tasks shipped in the package (rllm/data/gaia_demo)
    python examples/strands/eval_gaia.py --scripted --out runs/gaia-demo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rllm.agents.gaia import GaiaWorkflow, scripted_gaia_policy
from rllm.data.gaia import GAIA_DEMO_DIR, GAIA_LEVELS, load_gaia
from rllm.errors import SandboxUnavailableError
from rllm.eval.exit_codes import stopped_runs
from rllm.eval.models import add_model_arguments, check_model_arguments, choose_model, open_engine
from rllm.integrations.strands import Budget
from rllm.rewards.gaia_reward import gaia_ground_truth
from rllm.tools import describe_isolation
from rllm.types import Episode
from rllm.workflows import AgentWorkflowEngine

logger = logging.getLogger(__name__)


def _level_row() -> dict[str, Any]:
    return {"tasks": 0, "scored": 0, "correct": 0, "infrastructure_failures": 0, "unscored": 0, "accuracy": None}


def build_report(episodes: list[Episode], tasks: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per level and overall (infrastructure failures, errors, hidden answers left out), per-task rows."""
    levels = {str(level): _level_row() for level in GAIA_LEVELS}
    overall = _level_row()
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    reasons: dict[str, int] = {}
    for task, episode in zip(tasks, episodes, strict=True):
        reward_info = episode.info.get("reward") or {}
        infra = episode.termination_reason.is_infrastructure_failure
        scored = episode.termination_reason.is_scored and gaia_ground_truth(task) is not None
        for bucket in (levels[str(task["level"])], overall):
            bucket["tasks"] += 1
            bucket["infrastructure_failures"] += infra
            bucket["unscored"] += not infra and not scored
            bucket["scored"] += scored
            bucket["correct"] += scored and episode.is_correct
        reasons[episode.termination_reason.value] = reasons.get(episode.termination_reason.value, 0) + 1
        steps = episode.trajectories[0].steps if episode.trajectories else []
        row = {
            "task_id": task["id"],
            "level": task["level"],
            "has_attachment": task.get("file_path") is not None,
            "model_answer": reward_info.get("extracted_answer"),
            "ground_truth": gaia_ground_truth(task),
            "correct": bool(episode.is_correct) if scored else None,
            "termination_reason": episode.termination_reason.value,
            "turns": len(steps),
            "tool_calls": sum(len(step.tool_calls) for step in steps),
            "latency_s": round(episode.metrics.get("latency_s", 0.0), 3),
        }
        rows.append(row)
        if infra:
            failures.append({"task_id": task["id"], "level": task["level"], "reason": episode.termination_reason.value,
                             "error": episode.info.get("error", "")})
    for bucket in (*levels.values(), overall):
        bucket["accuracy"] = bucket["correct"] / bucket["scored"] if bucket["scored"] else None
    return {**meta, "levels": levels, "overall": overall, "termination_reasons": reasons,
            "infrastructure_failures": failures, "tasks": rows}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def render_summary(report: dict[str, Any]) -> Any:
    """A rich table: tasks, scored, correct, accuracy and infrastructure failures per level and overall."""
    from rich.table import Table

    table = Table(title=f"GAIA {report['split']} — {report['model']}", title_justify="left")
    for column in ("Level", "Tasks", "Scored", "Correct", "Accuracy", "Infra failures", "Unscored"):
        table.add_column(column, justify="left" if column == "Level" else "right")
    entries = [(f"Level {level}", report["levels"][str(level)]) for level in GAIA_LEVELS]
    entries.append(("Overall", report["overall"]))
    for index, (name, row) in enumerate(entries):
        table.add_row(name, str(row["tasks"]), str(row["scored"]), str(row["correct"]), _percent(row["accuracy"]),
                      str(row["infrastructure_failures"]), str(row["unscored"]), end_section=index == len(entries) - 2)
    return table


def plot_accuracy(report: dict[str, Any], path: Path) -> None:
    """Bar chart of accuracy per level and overall, annotated with correct/scored."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"Level {level}" for level in GAIA_LEVELS] + ["Overall"]
    rows = [report["levels"][str(level)] for level in GAIA_LEVELS] + [report["overall"]]
    values = [100 * (row["accuracy"] or 0.0) for row in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    bars = ax.bar(names, values, color=["#4C72B0", "#55A868", "#C44E52", "#8172B2"])
    for bar, row in zip(bars, rows, strict=True):
        label = f"{row['correct']}/{row['scored']}" if row["scored"] else "n/a"
        if row["infrastructure_failures"]:
            label += f"\n({row['infrastructure_failures']} infra fail)"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    xytext=(0, 3), textcoords="offset points", fontsize=9)
    ax.set_ylim(0, 115)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"GAIA {report['split']}: {report['model']}", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(report: dict[str, Any], episodes: list[Episode], out_dir: Path) -> Any:
    """Write report.json, submission.jsonl, summary.txt and accuracy.png; return the summary table."""
    from rich.console import Console

    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    with (out_dir / "submission.jsonl").open("w", encoding="utf-8") as handle:
        for row, episode in zip(report["tasks"], episodes, strict=True):
            entry = {"task_id": row["task_id"], "model_answer": row["model_answer"] or "",
                     "reasoning_trace": episode.info.get("final_answer", "")}
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
    table = render_summary(report)
    with (out_dir / "summary.txt").open("w", encoding="utf-8") as handle:
        Console(file=handle, width=100, color_system=None).print(table)
    plot_accuracy(report, out_dir / "accuracy.png")
    return table


# --------------------------------------------------------------------------- main
async def evaluate(args: argparse.Namespace, tasks: list[dict[str, Any]], engine: Any) -> list[Episode]:
    """Run every task through ``engine``; episodes come back in task order."""
    workflow_args = {
        "work_root": args.out / "work",
        "budget": Budget(max_model_turns=args.max_turns, max_tool_calls=args.max_tool_calls),
        "tool_options": {"python_timeout": args.python_timeout, "include_http": not args.no_http,
                         "python_sandbox": args.python_sandbox},
    }
    runner = AgentWorkflowEngine(GaiaWorkflow, workflow_args, engine, n_parallel_tasks=args.n_parallel,
                                 retry_limit=args.retry_limit, rollout_timeout=args.rollout_timeout,
                                 output_path=args.out / "episodes.jsonl", progress=not args.no_progress)
    try:
        return await runner.execute_tasks(tasks)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            await close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, max_tokens=4096, temperature=0.0, default_model=None)
    gaia = parser.add_argument_group("GAIA")
    gaia.add_argument("--data-dir", type=Path,
                      help="directory written by scripts/prepare_gaia.py (with --scripted, default: the shipped demo "
                           "tasks in rllm/data/gaia_demo)")
    gaia.add_argument("--split", default="validation", choices=["validation", "test"])
    gaia.add_argument("--level", type=int, action="append", choices=list(GAIA_LEVELS),
                      help="keep only this level (repeat for several)")
    gaia.add_argument("--limit", type=int, help="keep the first N tasks (after --level)")
    gaia.add_argument("--n-parallel", type=int, default=8, help="tasks run at once")
    gaia.add_argument("--out", type=Path, default=Path("runs/gaia"), help="output directory (resumed if it exists)")
    gaia.add_argument("--max-turns", type=int, default=20, help="model calls per task")
    gaia.add_argument("--max-tool-calls", type=int, default=40, help="tool calls per task")
    gaia.add_argument("--python-timeout", type=float, default=30.0, help="seconds per python_exec call")
    gaia.add_argument("--rollout-timeout", type=float, default=1800.0, help="seconds per task")
    gaia.add_argument("--retry-limit", type=int, default=2, help="reruns of a task after an infrastructure failure")
    gaia.add_argument("--no-http", action="store_true", help="leave out the http_request tool")
    gaia.add_argument("--unsafe-python-exec", action="store_true",
                      help="where no bubblewrap sandbox works, run python_exec with the audit-hook guard alone "
                           "(not a security boundary) instead of refusing to start")
    gaia.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    check_model_arguments(parser, args)
    args.python_sandbox = "auto" if args.unsafe_python_exec else "bwrap"
    if args.data_dir is None:
        if not args.scripted:
            parser.error("pass --data-dir DIR (download GAIA there with scripts/prepare_gaia.py), or "
                         f"--data-dir {GAIA_DEMO_DIR} for the shipped demo tasks")
        args.data_dir = GAIA_DEMO_DIR
    return args


def main(argv: list[str] | None = None) -> int:
    """Load tasks, run them, write and print the report; returns the exit status.

    2: a set-up problem (no data, no sandbox, no model); 1: the run stopped itself (the same error
    ended several tasks, or too many failed on infrastructure), what finished kept; 130: Ctrl-C.
    """
    from rich.console import Console

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "strands"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    console = Console(stderr=False)
    try:
        tasks = load_gaia(args.data_dir, args.split, level=args.level, limit=args.limit)
    except (FileNotFoundError, ValueError) as error:
        console.print(f"[red]error:[/red] {error}", highlight=False)
        return 2
    if not tasks:
        console.print(f"[red]error:[/red] no GAIA tasks in {args.data_dir} for split {args.split!r} "
                      f"and levels {args.level or 'all'}", highlight=False)
        return 2
    try:
        isolation = describe_isolation(args.python_sandbox)
    except SandboxUnavailableError as error:
        console.print(f"[red]error:[/red] {error}", highlight=False)
        return 2
    console.print(f"python_exec isolation: {isolation}", highlight=False)
    episodes_path = args.out / "episodes.jsonl"
    started = time.perf_counter()
    with stopped_runs(console, episodes_path, "a rerun with the same --out resumes") as end:
        choice = choose_model(args, console)
        args.out.mkdir(parents=True, exist_ok=True)
        with open_engine(args, choice, scripted_gaia_policy, "scripted (GAIA policy)") as (engine, description):
            console.print(f"model: {description}", highlight=False)
            logger.info("%d GAIA %s tasks from %s; output in %s", len(tasks), args.split, args.data_dir, args.out)
            episodes = asyncio.run(evaluate(args, tasks, engine))
    if end.exit_code is not None:
        return end.exit_code
    meta = {"model": choice.name, "model_kind": choice.kind, "engine": description,
            "base_url": args.base_url if choice.kind == "endpoint" else None, "scripted": args.scripted,
            "split": args.split, "data_dir": str(args.data_dir), "levels_selected": args.level or list(GAIA_LEVELS),
            "limit": args.limit, "python_isolation": isolation,
            "wall_time_s": round(time.perf_counter() - started, 2)}
    report = build_report(episodes, tasks, meta)
    table = write_outputs(report, episodes, args.out)
    console.print(table)
    if report["infrastructure_failures"]:
        console.print(f"[yellow]{len(report['infrastructure_failures'])} task(s) failed for infrastructure reasons "
                      "(not counted as wrong; rerun with the same --out to retry them):[/yellow]", highlight=False)
        for failure in report["infrastructure_failures"]:
            console.print(f"  {failure['task_id']} (level {failure['level']}): {failure['reason']} {failure['error']}",
                          highlight=False)
    console.print(f"episodes: {episodes_path}\nreport:   {args.out / 'report.json'}\n"
                  f"chart:    {args.out / 'accuracy.png'}\nsummary:  {args.out / 'summary.txt'}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
