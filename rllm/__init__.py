"""rllm: train and evaluate tool-using Strands agents with reinforcement learning."""

from rllm.types import Episode, ModelOutput, Step, TerminationReason, ToolCall, Trajectory

__all__ = ["Episode", "ModelOutput", "Step", "TerminationReason", "ToolCall", "Trajectory"]
__version__ = "0.1.0"
