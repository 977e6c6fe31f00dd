"""Reports of evaluation runs: pass@k, the HotpotQA score tables, one trajectory in brief."""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from rllm.tokens.renderer import content_text
from rllm.types import Episode, TerminationReason


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def search_report(episodes: list[Episode]) -> dict[str, Any]:
    """Exact match, F1, pass@k, mean turns and tool calls, termination reasons.

    Infrastructure failures (engine errors, aborted generations, timeouts), errors (a bug, not the
    policy's mistake) and cancelled episodes are counted apart and left out of every score; any other
    unfinished episode (max turns, max tokens) scores 0.
    """
    scored = [e for e in episodes if e.termination_reason.is_scored]
    per_task: dict[str, list[bool]] = defaultdict(list)
    for episode in scored:
        per_task[str(episode.info.get("task_id", episode.id))].append(episode.is_correct)
    n_max = max((len(v) for v in per_task.values()), default=0)
    ks = sorted({1, n_max, *(2**i for i in range(1, 8) if 2**i < n_max)} - {0})
    pass_k = {}
    for k in ks:
        eligible = [v for v in per_task.values() if len(v) >= k]
        if eligible:
            pass_k[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in eligible) / len(eligible)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return {
        "episodes": len(episodes),
        "tasks": len({str(e.info.get("task_id", e.id)) for e in episodes}),
        "scored": len(scored),
        "infrastructure_failures": sum(e.termination_reason.is_infrastructure_failure for e in episodes),
        "errors": sum(e.termination_reason is TerminationReason.ERROR for e in episodes),
        "cancelled": sum(e.termination_reason is TerminationReason.CANCELLED for e in episodes),
        "exact_match": mean([float(e.is_correct) for e in scored]),
        "f1": mean([float((e.info.get("reward") or {}).get("f1", 0.0)) for e in scored]),
        **pass_k,
        "mean_turns": mean([e.metrics.get("turns", 0.0) for e in scored]),
        "mean_tool_calls": mean([e.metrics.get("tool_calls", 0.0) for e in scored]),
        "mean_tool_errors": mean([e.metrics.get("tool_errors", 0.0) for e in scored]),
        "termination_reasons": dict(Counter(e.termination_reason.value for e in episodes).most_common()),
    }


def print_report(report: dict[str, Any], console: Console, title: str = "HotpotQA search agent") -> None:
    """The report as two tables: scores, then termination reasons."""
    scores = Table(title=title, show_header=False, title_justify="left")
    scores.add_column(style="bold")
    scores.add_column(justify="right")
    scores.add_row("episodes (tasks)", f"{report['episodes']} ({report['tasks']})")
    scores.add_row("scored", str(report["scored"]))
    scores.add_row("infrastructure failures (not scored)", str(report["infrastructure_failures"]))
    if report.get("errors"):
        scores.add_row("errors (a bug, not scored)", str(report["errors"]))
    if report.get("cancelled"):
        scores.add_row("cancelled (not scored)", str(report["cancelled"]))
    scores.add_row("exact match", f"{report['exact_match']:.3f}")
    scores.add_row("F1", f"{report['f1']:.3f}")
    for key, value in report.items():
        if key.startswith("pass@"):
            scores.add_row(key, f"{value:.3f}")
    scores.add_row("mean turns", f"{report['mean_turns']:.2f}")
    scores.add_row("mean tool calls", f"{report['mean_tool_calls']:.2f}")
    scores.add_row("mean refused tool calls", f"{report['mean_tool_errors']:.2f}")
    console.print(scores)
    reasons = Table(title="termination reasons", title_justify="left")
    reasons.add_column("reason")
    reasons.add_column("episodes", justify="right")
    reasons.add_column("infrastructure", justify="center")
    for reason, count in report["termination_reasons"].items():
        reasons.add_row(reason, str(count), "yes" if TerminationReason(reason).is_infrastructure_failure else "")
    console.print(reasons)


def format_trajectory(episode: Episode, width: int = 100) -> str:
    """A compact account of one episode: each turn's tool calls (with the titles found) and the answer."""
    task = episode.task or {}
    lines = [f"Q: {task.get('question', '?')}", f"gold: {task.get('answer', '?')}"]
    steps = episode.trajectories[0].steps if episode.trajectories else []
    for index, step in enumerate(steps, 1):
        for call in step.tool_calls:
            arguments = json.dumps(call.input, ensure_ascii=False) if call.input is not None else call.arguments
            lines.append(f"  turn {index}: {call.name}({arguments})"[:width])
            result = next((o for o in step.observation if o.get("tool_call_id") == call.id), None)
            if result is not None:
                text = content_text(result.get("content"), " ")
                titles = re.findall(r"^\[\d+\] (.+)$", text, re.MULTILINE)
                summary = "; ".join(titles) if titles else text.replace("\n", " ")
                lines.append(f"          -> {summary}"[:width])
        if not step.tool_calls:
            answer = step.model_output.text.strip().replace("\n", " ") or "(no text)"
            lines.append(f"  turn {index}: answer: {answer}"[: width * 2])
    extracted = (episode.info.get("reward") or {}).get("extracted")
    lines.append(f"=> {episode.termination_reason.value}; boxed answer: {extracted!r}; "
                 f"{'correct' if episode.is_correct else 'wrong'} (reward {episode.reward:g})")
    if episode.info.get("error"):
        lines.append(f"   {str(episode.info['error']).split('. ', 1)[0][: width * 2]}")
    return "\n".join(lines)
