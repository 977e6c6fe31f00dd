"""Strands Agents integration: run an unchanged Strands agent loop and record exact training data."""

from rllm.integrations.strands.agent import StrandsAgent
from rllm.integrations.strands.hooks import Budget, BudgetHook, ToolCallValidator, ToolFailureHook
from rllm.integrations.strands.model import RLLMModel
from rllm.integrations.strands.openai_model import NonStreamingOpenAIModel
from rllm.integrations.strands.recorder import RolloutRecorder, record
from rllm.integrations.strands.run_state import ModelCall
from rllm.integrations.strands.runner import run_served_rollout, run_traced_rollout
from rllm.integrations.strands.termination import describe_failure, termination_reason_for

__all__ = [
    "Budget",
    "BudgetHook",
    "ModelCall",
    "NonStreamingOpenAIModel",
    "RLLMModel",
    "RolloutRecorder",
    "StrandsAgent",
    "ToolCallValidator",
    "ToolFailureHook",
    "describe_failure",
    "record",
    "run_served_rollout",
    "run_traced_rollout",
    "termination_reason_for",
]
