"""Evaluate a tool-using Strands agent on GAIA through ``AgentWorkflowEngine``.

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

    # the real benchmark, against any OpenAI-compatible endpoint
    python scripts/prepare_gaia.py --data-dir data/gaia            # needs an HF token with GAIA access
    python examples/strands/eval_gaia.py --data-dir data/gaia --base-url http://127.0.0.1:8000/v1 \\
        --model Qwen/Qwen3-8B --level 1 --limit 20 --n-parallel 8 --out runs/gaia

    # offline: a scripted model on the shipped GAIA-format fixture
    python examples/strands/eval_gaia.py --scripted --out runs/gaia-demo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from rllm.data.gaia import GAIA_LEVELS, load_gaia
from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine
from rllm.engine.rollout import OpenAIEngine, RolloutEngine
from rllm.integrations.strands import Budget, StrandsAgent
from rllm.rewards.gaia_reward import RewardGaiaFn, gaia_ground_truth
from rllm.testing.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from rllm.tools import SandboxUnavailableError, describe_isolation, gaia_tools
from rllm.types import Episode
from rllm.workflows import StrandsWorkflow

logger = logging.getLogger("eval_gaia")

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DIR = ROOT / "tests" / "fixtures" / "gaia"

GAIA_SYSTEM_PROMPT = """\
You are a general AI assistant. You will be given a question; solve it step by step, using your \
tools whenever they help (arithmetic, fetching web pages, reading the task's files, running Python).
Report your reasoning, then finish your answer with a line of this form:
FINAL ANSWER: [YOUR FINAL ANSWER]
YOUR FINAL ANSWER should be a number OR as few words as possible OR a comma separated list of \
numbers and/or strings. For a number, do not write it with commas and do not add units such as \
$ or percent signs unless the question asks for them. For a string, do not use articles or \
abbreviations (e.g. for cities), and write digits in plain text unless the question says \
otherwise. For a comma separated list, apply these rules to each element."""


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:120] or "task"


def format_gaia_prompt(task: dict[str, Any], attachment: Path | None) -> str:
    """The user message: the question, plus where the attachment is when there is one."""
    prompt = task["question"].strip()
    if attachment is not None:
        prompt += (f"\n\nThe task comes with an attached file, `{attachment.name}`, in your working directory "
                   f"({attachment}). Read it with file_read, or process it with python_exec.")
    return prompt


class GaiaWorkflow(StrandsWorkflow):
    """``StrandsWorkflow`` giving every task a fresh work dir with a copy of its attachment.

    The tools are bound to that directory, so each run builds its agent (over the instance's
    stateless ``RLLMModel``) with ``gaia_tools(work_dir)``; nothing carries over between tasks.

    Args:
        rollout_engine: Engine behind the agent.
        work_root: Parent of the per-rollout work dirs (``work_root/<task id>_<rollout>``), kept
            after the run for inspection and replaced when a rollout is run again.
        system_prompt: The agent's system prompt.
        reward_fn: Scorer; GAIA's official rules by default.
        budget: Per-episode limits.
        tool_options: Keyword arguments of ``gaia_tools`` (``python_timeout``, ``include_http``, ...).
        model_kwargs: ``RLLMModel`` config.
        agent_kwargs: Extra ``StrandsAgent`` arguments.
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        *,
        work_root: str | Path,
        system_prompt: str = GAIA_SYSTEM_PROMPT,
        reward_fn: Any = None,
        budget: Budget | None = None,
        tool_options: dict[str, Any] | None = None,
        model_kwargs: dict[str, Any] | None = None,
        agent_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(rollout_engine, tools=[], system_prompt=system_prompt, reward_fn=reward_fn or RewardGaiaFn(),
                         budget=budget, model_kwargs=model_kwargs, agent_kwargs=agent_kwargs)
        self.work_root = Path(work_root).resolve()
        self.system_prompt = system_prompt
        self.budget = budget
        self.tool_options = dict(tool_options or {})
        self.agent_kwargs = dict(agent_kwargs or {})
        self.work_dir: Path | None = None
        self.task_to_prompt = self._prompt

    def _prompt(self, task: dict[str, Any]) -> str:
        attachment = None
        if task.get("file_path") and self.work_dir is not None:
            attachment = self.work_dir / Path(task["file_path"]).name
        return format_gaia_prompt(task, attachment)

    def _prepare_work_dir(self, task: dict[str, Any], uid: str) -> Path:
        work_dir = self.work_root / _safe_name(uid.replace(":", "_"))
        if work_dir.exists():
            shutil.rmtree(work_dir)
        work_dir.mkdir(parents=True)
        if task.get("file_path"):
            shutil.copy2(task["file_path"], work_dir / Path(task["file_path"]).name)
        return work_dir

    def reset(self) -> None:
        """Forget the previous task's work dir and agent state."""
        super().reset()
        self.work_dir = None

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        """Set up the task's work dir and tools, then run and score the agent."""
        self.work_dir = await asyncio.to_thread(self._prepare_work_dir, task, uid)
        self.agent = StrandsAgent(self.model, tools=gaia_tools(self.work_dir, **self.tool_options),
                                  system_prompt=self.system_prompt, budget=self.budget, **self.agent_kwargs)
        episode = await super().run(task, uid)
        episode.info["work_dir"] = str(self.work_dir)
        return episode

    def failed_episode(self, task: dict[str, Any], uid: str, reason: Any, error: str | None = None) -> Episode:
        """The partial episode of a failed run, with its work dir."""
        episode = super().failed_episode(task, uid, reason, error)
        if self.work_dir is not None:
            episode.info["work_dir"] = str(self.work_dir)
        return episode


# --------------------------------------------------------------------------- scripted model
_ATTACHMENT = re.compile(r"attached file, `([^`]+)`")
_EXPRESSION = re.compile(r"(?<![\w.])\(?\d[\d,.]*(?:\s*[-+*/^]\s*\(?\d[\d,.]*\)?)+")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _last_value(tool_output: str) -> str:
    """The last value in a tool's output: the last cell of a table row or the value of a "key: value" line."""
    lines = [line.strip() for line in tool_output.splitlines()]
    lines = [line for line in lines if line and not re.fullmatch(r"[\[\]{}(),]+", line) and not line.startswith("[")]
    if not lines:
        return ""
    line = lines[-1]
    if " | " in line:
        line = line.rsplit(" | ", 1)[1]
    elif ":" in line:
        line = line.split(":", 1)[1]
    return line.strip().strip('",').strip()


def scripted_gaia_policy(body: dict[str, Any]) -> ScriptedReply:
    """A stand-in model for offline runs: it uses the tools, then answers with the last value it saw.

    First turn: open the attachment with file_read, or hand an arithmetic expression in the question
    to the calculator, or give up. After reading a ``.py`` attachment it runs it with python_exec.
    Then it answers ``FINAL ANSWER: <last value of the last tool output>``. On the fixture this gets
    some tasks right and some wrong, which is what a demo of the scoring needs.
    """
    messages = body["messages"]
    question = _text(next(m["content"] for m in messages if m["role"] == "user"))
    calls = [c["function"]["name"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    attachment = _ATTACHMENT.search(question)
    if not calls:
        if attachment:
            return ScriptedReply(content="I will read the attached file first.",
                                 tool_calls=[ScriptedToolCall("file_read", json.dumps({"path": attachment.group(1)}))])
        expression = _EXPRESSION.search(question)
        if expression:
            cleaned = expression.group(0).replace(",", "")
            return ScriptedReply(content="This needs arithmetic.",
                                 tool_calls=[ScriptedToolCall("calculator", json.dumps({"expression": cleaned}))])
        return ScriptedReply(content="I cannot work this out with my tools.\nFINAL ANSWER: unknown")
    if calls[-1] == "file_read" and attachment and attachment.group(1).endswith(".py"):
        code = f"import runpy\nrunpy.run_path({attachment.group(1)!r}, run_name='__main__')"
        return ScriptedReply(content="Let me run the program.",
                             tool_calls=[ScriptedToolCall("python_exec", json.dumps({"code": code}))])
    last_output = _text(next(m["content"] for m in reversed(messages) if m["role"] == "tool"))
    answer = _last_value(last_output)
    return ScriptedReply(content=f"Based on the tool output, the answer is clear.\nFINAL ANSWER: {answer}")


# --------------------------------------------------------------------------- report
def _level_row() -> dict[str, Any]:
    return {"tasks": 0, "scored": 0, "correct": 0, "infrastructure_failures": 0, "unscored": 0, "accuracy": None}


def build_report(episodes: list[Episode], tasks: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per level and overall (infrastructure failures and hidden answers left out), and per-task rows."""
    levels = {str(level): _level_row() for level in GAIA_LEVELS}
    overall = _level_row()
    rows, failures, reasons = [], [], {}
    for task, episode in zip(tasks, episodes, strict=True):
        reward_info = episode.info.get("reward") or {}
        infra = episode.termination_reason.is_infrastructure_failure
        scored = not infra and gaia_ground_truth(task) is not None
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
def _check_endpoint(base_url: str, api_key: str) -> str | None:
    """A reason the endpoint cannot be used, or ``None``; only a connection failure counts."""
    try:
        httpx.get(f"{base_url.rstrip('/')}/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=10.0)
    except httpx.HTTPError as error:
        return f"cannot reach {base_url} ({type(error).__name__}: {error})"
    return None


async def evaluate(args: argparse.Namespace, tasks: list[dict[str, Any]]) -> list[Episode]:
    """Run every task through the engine; episodes come back in task order."""
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    rollout = OpenAIEngine(model=args.model, base_url=args.base_url, api_key=args.api_key,
                           timeout=args.request_timeout, max_retries=args.max_retries, **sampling)
    workflow_args = {
        "work_root": args.out / "work",
        "budget": Budget(max_model_turns=args.max_turns, max_tool_calls=args.max_tool_calls),
        "tool_options": {"python_timeout": args.python_timeout, "include_http": not args.no_http,
                         "python_sandbox": args.python_sandbox},
    }
    engine = AgentWorkflowEngine(GaiaWorkflow, workflow_args, rollout, n_parallel_tasks=args.n_parallel,
                                 retry_limit=args.retry_limit, rollout_timeout=args.rollout_timeout,
                                 output_path=args.out / "episodes.jsonl", progress=not args.no_progress)
    try:
        return await engine.execute_tasks(tasks)
    finally:
        await rollout.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="model name sent to the endpoint")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    parser.add_argument("--scripted", action="store_true",
                        help="offline demo: an embedded scripted model (default data: the shipped fixture)")
    parser.add_argument("--data-dir", type=Path, help="directory written by scripts/prepare_gaia.py")
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--level", type=int, action="append", choices=list(GAIA_LEVELS),
                        help="keep only this level (repeat for several)")
    parser.add_argument("--limit", type=int, help="keep the first N tasks (after --level)")
    parser.add_argument("--n-parallel", type=int, default=8, help="tasks run at once")
    parser.add_argument("--out", type=Path, default=Path("runs/gaia"), help="output directory (resumed if it exists)")
    parser.add_argument("--max-turns", type=int, default=20, help="model calls per task")
    parser.add_argument("--max-tool-calls", type=int, default=40, help="tool calls per task")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=4096, help="completion tokens per model call")
    parser.add_argument("--python-timeout", type=float, default=30.0, help="seconds per python_exec call")
    parser.add_argument("--rollout-timeout", type=float, default=1800.0, help="seconds per task")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per model request")
    parser.add_argument("--max-retries", type=int, default=5, help="retries of one model request (429, 5xx, network)")
    parser.add_argument("--retry-limit", type=int, default=2, help="reruns of a task after an infrastructure failure")
    parser.add_argument("--no-http", action="store_true", help="leave out the http_request tool")
    parser.add_argument("--unsafe-python-exec", action="store_true",
                        help="where no bubblewrap sandbox works, run python_exec with the audit-hook guard alone "
                             "(not a security boundary) instead of refusing to start")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    args.python_sandbox = "auto" if args.unsafe_python_exec else "bwrap"
    if args.scripted:
        if args.base_url:
            parser.error("--scripted runs its own model; leave out --base-url")
        args.model = args.model or "scripted"
        args.data_dir = args.data_dir or FIXTURE_DIR
    else:
        if not args.base_url or not args.model:
            parser.error("pass --base-url URL and --model NAME (an OpenAI-compatible endpoint), "
                         "or --scripted for the offline demo on the fixture")
        if args.data_dir is None:
            parser.error("pass --data-dir DIR (download GAIA there with scripts/prepare_gaia.py)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Load tasks, run them, write and print the report; returns the exit status."""
    from rich.console import Console

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "strands"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
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
    args.out.mkdir(parents=True, exist_ok=True)

    server = None
    if args.scripted:
        server = ScriptedOpenAIServer(scripted_gaia_policy, model=args.model).start()
        args.base_url = server.base_url
        logger.info("scripted model at %s plays the policy", args.base_url)
    else:
        problem = _check_endpoint(args.base_url, args.api_key)
        if problem is not None:
            console.print(f"[red]error:[/red] {problem}; start the server or fix --base-url", highlight=False)
            return 2
    logger.info("%d GAIA %s tasks from %s; output in %s", len(tasks), args.split, args.data_dir, args.out)
    started = time.perf_counter()
    try:
        episodes = asyncio.run(evaluate(args, tasks))
    except KeyboardInterrupt:
        console.print(f"interrupted; finished episodes are kept in {args.out / 'episodes.jsonl'} "
                      "and a rerun with the same --out resumes", highlight=False)
        return 130
    finally:
        if server is not None:
            server.stop()
    meta = {"model": args.model, "base_url": None if args.scripted else args.base_url, "scripted": args.scripted,
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
    console.print(f"episodes: {args.out / 'episodes.jsonl'}\nreport:   {args.out / 'report.json'}\n"
                  f"chart:    {args.out / 'accuracy.png'}\nsummary:  {args.out / 'summary.txt'}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
