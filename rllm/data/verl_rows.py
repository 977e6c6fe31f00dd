"""Tasks as verl RL rows, for any agent.

A verl row (``verl.utils.dataset.RLHFDataset``) has ``prompt`` (chat messages; verl hands them to
the agent loop as ``raw_prompt``), ``data_source``, ``reward_model.ground_truth``, ``extra_info``
(with an integer ``index``) and ``agent_name`` (which agent loop runs the row). Every row has the
same keys and types, since parquet needs one schema for the whole file. ``task_rows`` turns a
user's own tasks into rows, each task kept whole as JSON in ``extra_info.task`` (``row_task`` reads
it back); a recipe's agent may write its own rows instead (``rllm.agents.search.search_verl_rows``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rllm.data.tasks import default_task_to_prompt
from rllm.errors import ConfigurationError

AGENT_NAME = "strands_agent"
"""The agent-loop name of ``StrandsAgentLoop`` in the recipe's agent-loop YAML."""
TASK_FIELD = "task"
"""The ``extra_info`` field that holds a user's task as JSON (``task_rows``)."""
ROW_COLUMNS = ("prompt", "reward_model", "extra_info")
"""The columns that make a file verl rows rather than a user's tasks."""


def verl_row(
    *,
    index: int,
    split: str,
    system_prompt: str,
    question: str,
    data_source: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    agent_name: str = AGENT_NAME,
) -> dict[str, Any]:
    """One verl row.

    Args:
        index: Position in the split (verl traces and groups by ``extra_info.index``).
        split: ``train`` or ``validation``, kept in ``extra_info``.
        system_prompt: The agent's system message, first in ``prompt``.
        question: The user message.
        data_source: The row's ``data_source`` (verl logs validation metrics per source).
        ground_truth: ``reward_model.ground_truth``, handed to the reward function.
        extra_info: Further ``extra_info`` fields (the same keys and types in every row).
        agent_name: The agent-loop name in the agent-loop YAML.
    """
    return {
        "data_source": data_source,
        "agent_name": agent_name,
        "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": int(index), "split": split, **(extra_info or {})},
    }


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write verl rows to a parquet file (parent directories created)."""
    import pandas as pd

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def task_rows(
    tasks: Sequence[dict[str, Any]],
    split: str,
    *,
    task_to_prompt: Callable[[dict[str, Any]], Any] | None = None,
    agent_name: str = AGENT_NAME,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    """Verl rows for a user's own tasks: the user message from ``task_to_prompt``, the task whole in ``extra_info``.

    The prompt holds the user message only: the agent's system prompt is the factory's (or the recipe's
    ``rllm.agent_loop.system_prompt``). ``data_source`` is the task's own when it has one (verl logs
    validation per source), and ``ground_truth`` its ``answer`` as text (the reward reads the task, not it).
    Rows are numbered (``extra_info.index``, by which verl groups and traces) from ``first_index``, so the
    tasks of several files written one after another get ids unique across them.
    ``ConfigurationError`` names a task that is not JSON-serialisable or whose prompt is not text.
    """
    to_prompt = task_to_prompt or default_task_to_prompt
    rows = []
    for index, task in enumerate(tasks, start=first_index):
        try:
            question = to_prompt(task)
        except KeyError as error:
            raise ConfigurationError(f"{split} task {index}: {error.args[0] if error.args else error}") from None
        if not isinstance(question, str):
            raise ConfigurationError(f"{split} task {index}: task_to_prompt gave a {type(question).__name__}; "
                                     "training rows need the user message as text")
        try:
            encoded = json.dumps(task, sort_keys=True)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"{split} task {index} is not JSON-serialisable ({error}); training stores each "
                                     "task whole in its row") from None
        row = verl_row(index=index, split=split, system_prompt="", question=question,
                       data_source=str(task.get("data_source") or "tasks"),
                       ground_truth="" if task.get("answer") is None else str(task["answer"]),
                       extra_info={"id": str(task.get("id", index)), TASK_FIELD: encoded}, agent_name=agent_name)
        row["prompt"] = row["prompt"][1:]  # no system message: the agent's own
        rows.append(row)
    return rows


def row_task(row: dict[str, Any]) -> dict[str, Any] | None:
    """The user's task a row of ``task_rows`` holds (``None`` for a row written another way)."""
    encoded = (row.get("extra_info") or {}).get(TASK_FIELD)
    return None if encoded is None else json.loads(encoded)


def is_verl_rows(columns: Sequence[str]) -> bool:
    """Whether a file with these columns is verl rows already (else it holds a user's tasks)."""
    return all(column in columns for column in ROW_COLUMNS)


def scoring_task(task: dict[str, Any]) -> dict[str, Any]:
    """What a scorer reads from the task ``rllm.reward_fn`` gets: ``id`` and ``answer``.

    A user's task (``task_rows``) has them itself; for a row a recipe wrote another way the loop hands
    the reward function the row, whose answer is ``reward_model.ground_truth`` (a list of aliases
    too) and whose id is ``extra_info.id``.
    """
    if "answer" in task:
        return task
    reward_model = task.get("reward_model") or {}
    if "ground_truth" not in reward_model:
        raise ConfigurationError(f"the task {sorted(task)} has neither an 'answer' nor a reward_model.ground_truth "
                                 "to score against: write the rows with scripts/prepare_hotpotqa.py or task_rows")
    answer = reward_model["ground_truth"]
    if hasattr(answer, "tolist") and not isinstance(answer, str):  # a list of aliases read back from parquet
        answer = answer.tolist()
    return {"id": (task.get("extra_info") or {}).get("id"), "answer": answer}
