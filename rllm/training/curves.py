"""The learning curve of a run: training reward, validation score and tool calls per episode, by step.

Every run draws one (``learning_curve.png`` in its run directory) from what verl's file logger wrote
(``metrics.jsonl``): the launcher draws it when verl's trainer returns or fails, so ``AgentTrainer`` and
a recipe run alike have it; the quickstart and the learning proofs draw theirs from their own history
rows, which use the same names (``history_row``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LEARNING_CURVE = "learning_curve.png"
"""The curve's file name in the run's directory."""
TRAIN_REWARD = "critic/score/mean"
"""verl's mean reward of a training step's rollouts."""
TOOL_CALLS = "rllm/guard/tool_calls_per_episode"
"""Tool calls per episode of a training step (the tool-use guard's metric)."""
VALIDATION_PREFIXES = ("val-core/", "val-aux/")
"""verl's validation metrics: ``val-core/<data_source>/<reward or acc>/mean@<n>`` and the rest."""
_VAL_SCORE = re.compile(r"^val-core/.+/(reward|acc)/mean@\d+$")
_VAL_TOOL_CALLS = re.compile(r"^val-aux/.+/tool_calls/mean@\d+$")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The lines of verl's file logger (``{"step": N, "data": {...}}``) as ``{"step": N, **metrics}``, in order."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            rows.append({"step": entry.get("step"), **(entry.get("data") or {})})
    return rows


def validation_metrics(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Step -> verl's validation metrics logged at that step (step 0: before the first update)."""
    found: dict[int, dict[str, float]] = {}
    for row in rows:
        values = {k: v for k, v in row.items() if k.startswith(VALIDATION_PREFIXES)}
        if values and row.get("step") is not None:
            found.setdefault(int(row["step"]), {}).update(values)
    return found


def validation_score(metrics: dict[str, Any]) -> float | None:
    """The validation score of one step: verl's core metric (mean reward, or accuracy), averaged over data sources."""
    values = [float(value) for key, value in metrics.items() if _VAL_SCORE.match(key)]
    return statistics.fmean(values) if values else None


def history_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row of ``read_metrics`` as the curve reads it: ``train_reward``, ``tool_calls``, ``eval_reward``, ..."""
    out: dict[str, Any] = {"step": row["step"]}
    if TRAIN_REWARD in row:
        out["train_reward"] = float(row[TRAIN_REWARD])
    if TOOL_CALLS in row:
        out["tool_calls"] = float(row[TOOL_CALLS])
    score = validation_score(row)
    if score is not None:
        out["eval_reward"] = score
        calls = [float(v) for k, v in row.items() if _VAL_TOOL_CALLS.match(k)]
        if calls:
            out["eval_tool_calls"] = statistics.fmean(calls)
    return out


def plot_learning_curve(history: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """Draw training reward, held-out (validation) reward and tool calls per episode against the RL step.

    ``history`` rows carry ``step`` and any of ``train_reward``, ``eval_reward``, ``tool_calls``,
    ``eval_tool_calls``; a series with no point is left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(*names: str) -> list[tuple[float, float]]:
        points = []
        for row in history:
            value = next((row[name] for name in names if row.get(name) is not None), None)
            if value is not None and math.isfinite(float(value)):
                points.append((float(row["step"]), float(value)))
        return points

    fig, (reward_ax, tool_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    train, held = series("train_reward"), series("eval_reward")
    if train:
        reward_ax.plot(*zip(*train, strict=True), label="training reward", alpha=0.6)
    if held:
        reward_ax.plot(*zip(*held, strict=True), marker="o", label="held-out reward")
    rewards = [value for _, value in train + held]
    reward_ax.set(xlabel="RL step", ylabel="reward", title="reward")
    if rewards and all(0.0 <= value <= 1.0 for value in rewards):
        reward_ax.set_ylim(-0.02, 1.02)
    if train or held:
        reward_ax.legend(loc="best")
    tools = series("tool_calls", "eval_tool_calls")
    if tools:
        tool_ax.plot(*zip(*tools, strict=True), marker=".", color="tab:green")
    tool_ax.set(xlabel="RL step", ylabel="tool calls per episode", title="tool use")
    tool_ax.set_ylim(bottom=0, top=max([4.0, *(value + 0.5 for _, value in tools)]))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # a run that failed before verl made its folder
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_learning_curve(metrics_path: Path, path: Path, title: str = "") -> Path | None:
    """Draw the curve of the run whose verl file logger wrote ``metrics_path``; ``None`` when it logged no step."""
    history = [history_row(row) for row in read_metrics(metrics_path) if row.get("step") is not None]
    if not history:
        return None
    plot_learning_curve(history, path, title)
    return path


def draw_run_curve(run_dir: Path, metrics_path: Path, *, since: float | None = None) -> Path | None:
    """Draw ``learning_curve.png`` in ``run_dir`` from the run's metrics and log its validation scores.

    The launcher calls it when verl's trainer returned or failed. ``since``: the run's start, so an earlier
    run's metrics file is not drawn again. A failure to draw is logged, never raised: it must not hide how
    the run itself ended.
    """
    if not metrics_path.is_file() or (since is not None and metrics_path.stat().st_mtime < since):
        logger.warning("no learning curve: verl's file logger wrote nothing for this run to %s (trainer.logger "
                       "needs 'file')", metrics_path)
        return None
    try:
        rows = read_metrics(metrics_path)
        scores = {step: validation_score(values) for step, values in validation_metrics(rows).items()}
        if scores:
            logger.info("validation score by step: %s", ", ".join(
                f"{step}: {score:.3f}" for step, score in scores.items() if score is not None))
        curve = draw_learning_curve(metrics_path, run_dir / LEARNING_CURVE, title=run_dir.name)
    except Exception:  # noqa: BLE001 - the run's own outcome matters more than its picture
        logger.warning("could not draw the learning curve from %s", metrics_path, exc_info=True)
        return None
    if curve is not None:
        logger.info("learning curve: %s", curve)
    return curve
