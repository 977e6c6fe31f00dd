"""The learning curve every run draws, from the lines verl's file logger writes (``metrics.jsonl``).

A metrics file written here as verl writes it (validation before the first step and at the last, training
metrics on each step): the validation metrics by step, the score of each, the history the curve reads, and
the PNG drawn; a file from an earlier run is not drawn again, and a run without one says why.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from rllm.training.curves import (
    LEARNING_CURVE,
    draw_learning_curve,
    draw_run_curve,
    history_row,
    read_metrics,
    validation_metrics,
    validation_score,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _write_metrics(path: Path) -> Path:
    """Three lines as verl's FileLogger writes them: step 0 (validation only), step 1, step 2 (+ validation)."""
    val = {"val-core/tasks/reward/mean@2": 0.25, "val-aux/tasks/correct/mean@2": 0.0,
           "val-aux/tasks/tool_calls/mean@2": 1.5, "val-aux/num_turns/mean": 2.0}
    lines = [
        {"step": 0, "data": val},
        {"step": 1, "data": {"critic/score/mean": 0.1, "rllm/guard/tool_calls_per_episode": 1.0,
                             "actor/grad_norm": 0.3}},
        {"step": 2, "data": {"critic/score/mean": 0.4, "rllm/guard/tool_calls_per_episode": 2.5,
                             **{**val, "val-core/tasks/reward/mean@2": 0.75}}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_validation_is_read_by_step_with_verls_own_names(tmp_path: Path) -> None:
    rows = read_metrics(_write_metrics(tmp_path / "metrics.jsonl"))
    assert [row["step"] for row in rows] == [0, 1, 2]
    validation = validation_metrics(rows)
    assert sorted(validation) == [0, 2]  # before the first step and at the last; none at step 1
    assert validation[2]["val-core/tasks/reward/mean@2"] == 0.75 and "critic/score/mean" not in validation[2]
    assert validation_score(validation[0]) == 0.25 and validation_score(validation[2]) == 0.75
    # Two data sources: the score is their mean; accuracy counts when verl makes it the core metric.
    assert validation_score({"val-core/a/reward/mean@4": 0.2, "val-core/b/acc/mean@4": 0.6,
                             "val-aux/a/reward/std@4": 9.0}) == pytest.approx(0.4)
    assert validation_score({"val-aux/a/reward/std@4": 9.0}) is None


def test_the_history_row_carries_what_the_curve_plots(tmp_path: Path) -> None:
    rows = read_metrics(_write_metrics(tmp_path / "metrics.jsonl"))
    history = [history_row(row) for row in rows]
    assert history[0] == {"step": 0, "eval_reward": 0.25, "eval_tool_calls": 1.5}
    assert history[1] == {"step": 1, "train_reward": 0.1, "tool_calls": 1.0}
    assert history[2] == {"step": 2, "train_reward": 0.4, "tool_calls": 2.5, "eval_reward": 0.75,
                          "eval_tool_calls": 1.5}


def test_the_curve_is_drawn_from_the_runs_metrics(tmp_path: Path) -> None:
    metrics = _write_metrics(tmp_path / "metrics.jsonl")
    curve = draw_learning_curve(metrics, tmp_path / "curve.png", title="a run")
    assert curve == tmp_path / "curve.png" and curve.read_bytes()[:8] == PNG and curve.stat().st_size > 10_000
    # A run without validation, or with rewards outside [0, 1], still draws.
    metrics.write_text(json.dumps({"step": 1, "data": {"critic/score/mean": -3.0}}) + "\n", encoding="utf-8")
    assert draw_learning_curve(metrics, tmp_path / "bare.png").read_bytes()[:8] == PNG  # type: ignore[union-attr]
    metrics.write_text("", encoding="utf-8")
    assert draw_learning_curve(metrics, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_the_launcher_draws_this_runs_curve_and_logs_its_validation(tmp_path: Path, caplog) -> None:
    started = time.time()
    metrics = _write_metrics(tmp_path / "metrics.jsonl")
    with caplog.at_level(logging.INFO, logger="rllm.training.curves"):
        curve = draw_run_curve(tmp_path, metrics, since=started - 1)
    assert curve == tmp_path / LEARNING_CURVE and curve.read_bytes()[:8] == PNG
    assert "validation score by step: 0: 0.250, 2: 0.750" in caplog.text
    # A metrics file an earlier run left (this run failed before verl's logger started): no curve, said why.
    curve.unlink()
    os.utime(metrics, (started - 60, started - 60))
    with caplog.at_level(logging.WARNING, logger="rllm.training.curves"):
        assert draw_run_curve(tmp_path, metrics, since=started) is None
    assert not curve.exists() and "verl's file logger wrote nothing for this run" in caplog.text
    # A broken file is logged, not raised: the run's own ending is what the caller reports.
    metrics.write_text("{not json\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="rllm.training.curves"):
        assert draw_run_curve(tmp_path, metrics) is None
    assert "could not draw the learning curve" in caplog.text
