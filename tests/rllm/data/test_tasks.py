"""A user's tasks load from every form ``AgentTrainer`` takes and become verl rows that keep each task whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rllm.data.tasks import load_tasks
from rllm.data.verl_rows import is_verl_rows, row_task, task_rows, write_parquet
from rllm.errors import ConfigurationError

TASKS = [{"id": "a", "question": "Capital of France?", "capital": "Paris", "tags": ["eu", "big"], "n": 3},
         {"id": "b", "question": "Capital of Peru?", "capital": "Lima", "tags": [], "n": 1}]


def _forms(tmp_path: Path) -> dict[str, Any]:
    import datasets
    import pandas as pd

    (tmp_path / "t.json").write_text(json.dumps(TASKS))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS) + "\n")
    pd.DataFrame(TASKS).to_parquet(tmp_path / "t.parquet")
    return {"list": TASKS, "json": tmp_path / "t.json", "jsonl": str(tmp_path / "t.jsonl"),
            "parquet": tmp_path / "t.parquet", "datasets": datasets.Dataset.from_list(TASKS)}


def test_every_form_gives_the_same_plain_task_dicts(tmp_path: Path) -> None:
    for form, source in _forms(tmp_path).items():
        tasks = load_tasks(source)
        assert tasks == TASKS, form
        assert json.dumps(tasks)  # plain Python values, whatever numpy or arrow held them as


def test_rows_keep_each_task_whole_and_ask_its_question(tmp_path: Path) -> None:
    rows = task_rows(TASKS, "train")
    assert [row_task(row) for row in rows] == TASKS
    assert rows[0]["prompt"] == [{"role": "user", "content": "Capital of France?"}]  # the agent's own system prompt
    assert [row["extra_info"]["index"] for row in rows] == [0, 1]
    path = write_parquet(rows, tmp_path / "rows.parquet")
    import pyarrow.parquet as pq

    assert is_verl_rows(pq.read_schema(path).names) and not is_verl_rows(pq.read_schema(tmp_path / "rows.parquet").names[:1])
    assert [row_task(row) for row in pq.read_table(path).to_pylist()] == TASKS  # through parquet, unchanged
    assert task_rows(TASKS, "train", task_to_prompt=lambda t: f"Where is {t['capital']}?")[1]["prompt"][0]["content"] \
        == "Where is Lima?"


@pytest.mark.parametrize(("source", "message"), [
    ([], "no tasks"),
    ({"question": "x"}, "a single dict"),
    (["What is 2+2?"], "task 0 is a str, not a dict"),
    (42, "int is not a list of task dicts"),
    ("missing.jsonl", "no file missing.jsonl"),
])
def test_what_is_not_tasks_is_refused_naming_it(source: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_tasks(source, name="train_dataset")


def test_a_task_without_a_question_or_not_json_is_refused_naming_the_task() -> None:
    with pytest.raises(ConfigurationError, match="train task 1: task b has no 'question'"):
        task_rows([TASKS[0], {"id": "b", "capital": "Lima"}], "train")
    with pytest.raises(ConfigurationError, match="train task 0 is not JSON-serialisable"):
        task_rows([{"question": "q", "when": object()}], "train")


def test_a_list_of_task_files_is_one_dataset_whose_rows_are_numbered_across_the_files(tmp_path: Path) -> None:
    forms = _forms(tmp_path)
    tasks = load_tasks([forms["jsonl"], forms["parquet"]], name="train_dataset")
    assert tasks == TASKS + TASKS  # the files' tasks in order
    assert [row["extra_info"]["index"] for row in task_rows(tasks, "train")] == [0, 1, 2, 3]
    # A file written after others starts after them: verl groups rollouts by this index over all its files.
    assert [row["extra_info"]["index"] for row in task_rows(TASKS, "train", first_index=2)] == [2, 3]
    with pytest.raises(ConfigurationError, match="no file .*missing.json"):
        load_tasks([forms["json"], tmp_path / "missing.json"], name="train_dataset")


def test_the_refusal_of_a_task_without_a_question_names_the_keys_that_fix_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        task_rows([{"id": "b", "capital": "Lima"}], "train")
    assert "AgentTrainer's workflow_args['task_to_prompt']" in str(caught.value)
    assert "rllm.agent_loop.task_to_prompt=module:function" in str(caught.value)
