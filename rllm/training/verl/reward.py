"""The verl custom reward function for Strands agents: score the final answer only.

Configured as ``reward.custom_reward_function.path: pkg://rllm.training.verl.reward`` (name
``compute_score``) with ``reward_kwargs.scorer`` naming the agent's scorer (the search agent's is
``rllm.agents.search:score_search_answer``). verl's naive reward manager calls it once per rollout
with the decoded response, which here holds every turn, tool output included; the answer is
therefore read from ``extra_info["final_answer"]``, the agent's last message as
``StrandsAgentLoop`` recorded it (verl merges the loop's ``extra_fields`` into ``extra_info``),
never parsed out of that text.
"""

from __future__ import annotations

import logging
from typing import Any

from rllm.training.verl._dotted import import_object

logger = logging.getLogger(__name__)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    scorer: str,
    **scorer_kwargs: Any,
) -> dict[str, float]:
    """Score one rollout's final answer with the agent's scorer.

    Args:
        data_source: The row's ``data_source`` (unused: the scorer knows its data).
        solution_str: The decoded response, tool output included; ignored on purpose.
        ground_truth: ``reward_model.ground_truth``: the answer, or a list of accepted aliases.
        extra_info: The row's ``extra_info`` merged with the loop's ``extra_fields``.
        scorer: ``module:function`` with ``function(task, final_answer, **scorer_kwargs)`` returning
            ``score`` plus numbers verl logs per validation data source.
        **scorer_kwargs: The rest of ``reward_kwargs`` (e.g. ``partial_credit``).

    Returns:
        The scorer's numbers plus ``tool_calls``.
    """
    info = extra_info or {}
    if "final_answer" not in info:
        raise KeyError(
            "extra_info has no 'final_answer': this reward scores rollouts of "
            "rllm.training.verl.agent_loop.StrandsAgentLoop (set agent_name / default_agent_loop)"
        )
    score = import_object(scorer)
    task = {"id": info.get("id"), "answer": _plain(ground_truth)}
    tool_calls = float(info.get("num_tool_calls") or 0)
    if info.get("infra_failure"):
        # Only the legacy v0 trainer gets here (v1 drops the rollout); its mask is all zero.
        logger.warning("scoring an infrastructure failure as 0 with no gradient: %s", info.get("infra_error"))
        return {**{key: 0.0 for key in score(task, "", **scorer_kwargs)}, "tool_calls": tool_calls}
    return {**score(task, info["final_answer"], **scorer_kwargs), "tool_calls": tool_calls}


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, str):
        return value.tolist()
    return value
