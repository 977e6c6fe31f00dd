"""Reward functions: ``reward_fn(task, final_answer_text) -> RewardOutput``."""

from rllm.rewards.base import RewardFn, RewardOutput
from rllm.rewards.gaia_reward import RewardGaiaFn, gaia_score
from rllm.rewards.search_reward import RewardSearchFn, exact_match, extract_boxed, f1_score, normalize_answer

__all__ = [
    "RewardFn",
    "RewardGaiaFn",
    "RewardOutput",
    "RewardSearchFn",
    "gaia_score",
    "exact_match",
    "extract_boxed",
    "f1_score",
    "normalize_answer",
]
