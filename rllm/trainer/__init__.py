"""Where rLLM's users import the trainer from: ``from rllm.trainer import AgentTrainer``."""

from rllm.training.agent_trainer import AgentTrainer, TrainResult

__all__ = ["AgentTrainer", "TrainResult"]
