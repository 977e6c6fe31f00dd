"""Tasks as verl RL rows, for any agent.

A verl row (``verl.utils.dataset.RLHFDataset``) has ``prompt`` (chat messages; verl hands them to
the agent loop as ``raw_prompt``), ``data_source``, ``reward_model.ground_truth``, ``extra_info``
(with an integer ``index``) and ``agent_name`` (which agent loop runs the row). Every row has the
same keys and types, since parquet needs one schema for the whole file. What goes into a row for
a given task (prompt, answer, metadata) is the agent's business (``rllm.agents.search.search_verl_rows``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

AGENT_NAME = "strands_agent"
"""The agent-loop name of ``StrandsAgentLoop`` in the recipe's agent-loop YAML."""


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
