"""The verl custom reward function for Strands agents: score the final answer only.

Configured as ``reward.custom_reward_function.path: pkg://rllm.training.verl.reward`` (name
``compute_score``). With ``rllm.reward_fn`` (the workflow's ``reward_fn(task, final_answer)``) the
agent loop has scored the rollout already and this returns that score; otherwise
``reward_kwargs.scorer`` names the agent's scorer (the search recipe's is
``rllm.agents.search:score_search_answer``). verl calls it once per rollout with the decoded
response, which holds every turn, tool output included; the answer is read from
``extra_info["final_answer"]``, the agent's last message as ``StrandsAgentLoop`` recorded it (verl
merges the loop's ``extra_fields`` into ``extra_info``), never parsed out of that text.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

from rllm.errors import ConfigurationError
from rllm.rewards.base import task_name
from rllm.training.verl._dotted import import_object

REWARD_FIELD = "rllm_reward"
"""The ``extra_fields`` entry where ``StrandsAgentLoop`` puts its score with ``rllm.reward_fn``."""
CORRECT_FIELD = "rllm_is_correct"
"""The ``extra_fields`` entry where it puts whether that score counts as correct."""
RLLM_REWARD_PATH = "pkg://rllm.training.verl.reward"
"""How a recipe names this reward function (``reward.custom_reward_function.path``)."""

logger = logging.getLogger(__name__)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    scorer: str | None = None,
    **scorer_kwargs: Any,
) -> dict[str, float]:
    """Score one rollout's final answer: the loop's score with ``rllm.reward_fn``, else the recipe's scorer.

    Args:
        data_source: The row's ``data_source`` (unused: the scorer knows its data).
        solution_str: The decoded response, tool output included; ignored on purpose.
        ground_truth: ``reward_model.ground_truth``: the answer, or a list of accepted aliases.
        extra_info: The row's ``extra_info`` merged with the loop's ``extra_fields``.
        scorer: ``module:function`` with ``function(task, final_answer, **scorer_kwargs)`` returning
            ``score`` plus numbers verl logs per validation data source; ``None`` with ``rllm.reward_fn``.
        **scorer_kwargs: The rest of ``reward_kwargs`` (e.g. ``partial_credit``).

    Returns:
        ``score`` and the scorer's other numbers (``correct`` with ``rllm.reward_fn``), plus ``tool_calls``.
    """
    info = extra_info or {}
    if "final_answer" not in info:
        raise ConfigurationError(
            f"reward.custom_reward_function.path={RLLM_REWARD_PATH} scores rollouts of "
            "rllm.training.verl.agent_loop.StrandsAgentLoop, and this row's rollout has no 'final_answer' in its "
            "extra_info: run the row with StrandsAgentLoop (the row's agent_name, or "
            "actor_rollout_ref.rollout.agent.default_agent_loop=strands_agent), or name another reward function"
        )
    tool_calls = float(info.get("num_tool_calls") or 0)
    if REWARD_FIELD in info:  # scored by the loop with the workflow's reward function
        return {"score": float(info[REWARD_FIELD]), "correct": float(bool(info.get(CORRECT_FIELD))),
                "tool_calls": tool_calls}
    if scorer is None:
        raise ConfigurationError("the rollout has no score: set rllm.reward_fn (module:function scoring "
                                 "(task, final_answer)) or reward.custom_reward_function.reward_kwargs.scorer")
    score = import_object(scorer)
    task = {"id": info.get("id"), "answer": _plain(ground_truth)}
    scored = score(task, info["final_answer"], **scorer_kwargs)
    value = scored.get("score") if isinstance(scored, dict) else None
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)):
        raise ConfigurationError(f"reward.custom_reward_function.reward_kwargs.scorer={scorer} returned "
                                 f"{scored!r} for {task_name(task)}; it returns a dict with a finite 'score'")
    return {**scored, "tool_calls": tool_calls}


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, str):
        return value.tolist()
    return value
