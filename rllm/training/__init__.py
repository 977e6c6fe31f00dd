"""Local training on one machine: rollouts through the verl loop's runner, verl's RLOO math, the learning proof.

``run_rollouts`` runs Strands agents on a token engine and exports their exact tokens as verl's
agent loop does; ``pad_rollouts`` lays them out as verl pads them; ``LocalRLOOTrainer`` takes RLOO
steps with verl's advantage, loss and log-prob functions on the module the engine samples from.
For proofs, debugging and small models; verl (``rllm.integrations.verl``) is the path for real runs.
"""

from rllm.training.batch import RolloutBatch, pad_rollouts
from rllm.training.rloo import LocalRLOOTrainer, UpdateMetrics, default_actor_config
from rllm.training.rollouts import Rollout, RolloutRequest, run_rollout, run_rollouts

__all__ = [
    "LocalRLOOTrainer",
    "Rollout",
    "RolloutBatch",
    "RolloutRequest",
    "UpdateMetrics",
    "default_actor_config",
    "pad_rollouts",
    "run_rollout",
    "run_rollouts",
]
