"""A user's tasks, from wherever they are: a list of dicts, a JSON, JSONL or parquet file, a ``datasets.Dataset``.

A task is a dict with any fields of the user's own; it reaches the agent factory and the reward
unchanged, in evaluation and in training. Training stores it in its verl row as JSON
(``rllm.data.verl_rows.task_rows``), so a task must be JSON-serialisable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rllm.errors import ConfigurationError

TASK_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")
"""The task files ``load_tasks`` reads."""

Tasks = Iterable[Mapping[str, Any]] | str | Path | Any
"""What ``load_tasks`` takes: dicts, a path to a task file, or a ``datasets.Dataset``."""


def load_tasks(source: Tasks, *, name: str = "dataset") -> list[dict[str, Any]]:
    """The tasks of ``source`` as plain dicts, in order; ``ConfigurationError`` naming ``name`` when they are not.

    Args:
        source: A list (any iterable) of dicts; a path to a ``.json`` file (a list of objects), a
            ``.jsonl`` file (one object a line) or a ``.parquet`` file (one task a row), or a list of
            such paths (their tasks in order, as one dataset); or a ``datasets.Dataset``.
        name: What the tasks are called in an error (``train_dataset``, ``data.train_files``).
    """
    if isinstance(source, str | Path):
        tasks = _read_file(Path(source), name)
    elif isinstance(source, list | tuple) and source and all(_is_task_file(item) for item in source):
        tasks = [task for item in source for task in _read_file(Path(item), name)]
    elif isinstance(source, Mapping):
        raise ConfigurationError(f"{name}: a single dict; give a list of task dicts")
    else:
        try:
            tasks = [_plain(task) for task in source]
        except TypeError as error:
            raise ConfigurationError(f"{name}: {type(source).__name__} is not a list of task dicts, a path to a "
                                     f"{'/'.join(TASK_FILE_SUFFIXES)} file or a datasets.Dataset") from error
    if not tasks:
        raise ConfigurationError(f"{name}: no tasks")
    for index, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise ConfigurationError(f"{name}: task {index} is a {type(task).__name__}, not a dict")
    return tasks


def default_task_to_prompt(task: dict[str, Any]) -> str:
    """The task's ``question`` (or ``prompt``, ``problem``) as the user message."""
    for key in ("question", "prompt", "problem"):
        if isinstance(task.get(key), str):
            return task[key]
    raise KeyError(f"task {task.get('id', '?')} has no 'question', 'prompt' or 'problem'; pass task_to_prompt, "
                   "a function from the task to the user message: AgentTrainer's workflow_args['task_to_prompt'], "
                   "or the recipe's rllm.agent_loop.task_to_prompt=module:function")


def _is_task_file(item: Any) -> bool:
    """A path to a task file: a ``Path``, or text ending in a task file's suffix (not a task given as text)."""
    return isinstance(item, Path) or (isinstance(item, str) and item.lower().endswith(TASK_FILE_SUFFIXES))


def _read_file(path: Path, name: str) -> list[Any]:
    if not path.is_file():
        raise ConfigurationError(f"{name}: no file {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        try:
            return [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as error:
            raise ConfigurationError(f"{name}: {path} line {error.lineno}: not JSON ({error.msg})") from None
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ConfigurationError(f"{name}: {path} is not JSON ({error})") from None
        if not isinstance(data, list):
            raise ConfigurationError(f"{name}: {path} holds a {type(data).__name__}; a task file holds a list of "
                                     "task objects")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [_plain(row) for row in pq.read_table(path).to_pylist()]
    raise ConfigurationError(f"{name}: {path} is not a task file ({', '.join(TASK_FILE_SUFFIXES)})")


def _plain(value: Any) -> Any:
    """Plain Python values for numpy / pandas ones (a parquet or ``datasets`` row)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    return value
