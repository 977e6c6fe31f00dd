"""The loop's score as verl takes it: ``AgentLoopOutput.reward_score`` and the numbers verl logs beside it.

``StrandsAgentLoop`` scores a finished rollout with ``rllm.reward_fn`` (``function(task, final_answer)``,
as ``StrandsWorkflow`` scores in evaluation) and hands the score to verl on its outputs: verl 0.9.1's
agent-loop worker calls no reward function for an output whose ``reward_score`` is set, puts the score
on the last response token (``rm_scores``) and copies the last output's score and
``extra_fields["reward_extra_info"]`` onto the rollout's other samples; validation reads the same
fields (``val-core/<data_source>/reward/mean@N``, ``val-aux/<data_source>/<name>/...``). No verl reward
function is named in the recipes: ``reward.custom_reward_function`` stays verl's default (null). Works
without verl installed.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from rllm.rewards.base import RewardOutput

REWARD_EXTRA_INFO = "reward_extra_info"
"""The ``extra_fields`` entry verl reads a scored output's logged numbers from (its reward loop writes it too)."""
LEGACY_REWARD_PATH = "pkg://rllm.training.verl.reward"
"""How recipes used to name a verl reward function that read the loop's score back; refused at launch now."""
LEGACY_SCORER_KEY = "reward.custom_reward_function.reward_kwargs.scorer"
"""Where recipes used to name their scorer; ``rllm.reward_fn`` names it now, refused at launch."""


def reward_numbers(reward: RewardOutput, *, tool_calls: int) -> dict[str, float]:
    """The numbers verl logs for one scored rollout: ``score``, ``correct``, ``tool_calls`` and the metadata's numbers.

    A number (or bool) in ``reward.metadata`` is logged under its key (the search reward's ``f1``);
    anything else there (an extracted answer, a reason) is not. verl averages each key over a
    validation data source, so a reward function gives the same numeric keys for every answer.
    """
    logged = {key: float(value) for key, value in reward.metadata.items()
              if isinstance(value, numbers.Real) and isinstance(key, str)}  # bools too
    return {**logged, "score": float(reward.reward), "correct": float(bool(reward.is_correct)),
            "tool_calls": float(tool_calls)}


def hand_to_verl(outputs: Iterable[Any], reward: RewardOutput, *, tool_calls: int) -> None:
    """Set the rollout's score on each of its ``AgentLoopOutput``s, with the numbers verl logs beside it.

    Every sample carries it (verl would copy the last one's onto the others anyway), so a rollout's
    rows agree whichever of verl's workers stores them.
    """
    info = reward_numbers(reward, tool_calls=tool_calls)
    for output in outputs:
        output.reward_score = float(reward.reward)
        output.extra_fields[REWARD_EXTRA_INFO] = dict(info)
