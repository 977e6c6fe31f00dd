"""The score the loop hands verl (``rllm.training.verl.reward``): what verl logs beside it, on every sample."""

from __future__ import annotations

from types import SimpleNamespace

from rllm.agents.search import search_row_reward
from rllm.rewards.base import RewardOutput
from rllm.rewards.search_reward import RewardSearchFn
from rllm.training.verl.reward import REWARD_EXTRA_INFO, hand_to_verl, reward_numbers


def test_verl_logs_the_score_correct_tool_calls_and_the_rewards_numbers_only() -> None:
    reward = RewardSearchFn()({"answer": "Paris"}, "It is \\boxed{Paris}.")  # metadata: em, f1, extracted, ...
    numbers = reward_numbers(reward, tool_calls=3)
    assert numbers == {"score": 1.0, "correct": 1.0, "tool_calls": 3.0, "em": 1.0, "f1": 1.0}
    assert all(isinstance(value, float) for value in numbers.values())
    # The metadata cannot rename what the loop reports: score and correct are the RewardOutput's own.
    clash = RewardOutput(reward=0.25, is_correct=False, metadata={"score": 9, "correct": True, "why": "partial"})
    assert reward_numbers(clash, tool_calls=0) == {"score": 0.25, "correct": 0.0, "tool_calls": 0.0}


def test_every_sample_of_a_rollout_carries_its_score_with_the_same_numbers() -> None:
    outputs = [SimpleNamespace(reward_score=None, extra_fields={"sample_index": i}) for i in range(3)]
    hand_to_verl(outputs, search_row_reward({"reward_model": {"ground_truth": ["Paris", "City of Paris"]},
                                              "extra_info": {"id": "q0"}}, "\\boxed{paris}"), tool_calls=1)
    assert [o.reward_score for o in outputs] == [1.0, 1.0, 1.0]
    infos = [o.extra_fields[REWARD_EXTRA_INFO] for o in outputs]
    assert infos == [{"score": 1.0, "correct": 1.0, "f1": 1.0, "boxed": 1.0, "tool_calls": 1.0}] * 3
    assert infos[0] is not infos[1]  # one dict per sample: verl may write into one without touching the others
    assert [o.extra_fields["sample_index"] for o in outputs] == [0, 1, 2]
