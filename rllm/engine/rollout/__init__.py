"""Rollout engines: chat messages in, one ``ModelOutput`` out."""

from rllm.engine.rollout.base import SAMPLING_PARAMS, RolloutEngine
from rllm.engine.rollout.openai_engine import OpenAIEngine

__all__ = ["SAMPLING_PARAMS", "OpenAIEngine", "RolloutEngine"]
