"""Rollout engines: chat messages in, one ``ModelOutput`` out."""

from rllm.engine.rollout.base import (
    SAMPLING_PARAMS,
    ContextLengthExceededError,
    EngineError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    GenerationAbortedError,
    RolloutEngine,
)
from rllm.engine.rollout.openai_engine import OpenAIEngine

__all__ = [
    "SAMPLING_PARAMS",
    "ContextLengthExceededError",
    "EngineError",
    "EngineRequestError",
    "EngineThrottledError",
    "EngineUnavailableError",
    "GenerationAbortedError",
    "OpenAIEngine",
    "RolloutEngine",
]
