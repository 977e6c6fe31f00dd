"""Local training on one machine: rollouts through the verl loop's runner, verl's RLOO math, the learning proof.

``run_rollouts`` runs Strands agents on a token engine through the runner verl's agent loop uses
(``run_rollout``) and keeps their exact tokens; ``pad_rollouts`` lays them out as verl pads them;
``LocalRLOOTrainer`` takes RLOO
steps with verl's advantage, loss and log-prob functions on the module the engine samples from.
For proofs, debugging and small models; verl (``rllm.training.verl``) is the path for real runs.
"""

from rllm.training.local.batch import RolloutBatch, pad_rollouts
from rllm.training.local.rloo import LocalRLOOTrainer, UpdateMetrics, default_actor_config
from rllm.training.local.rollouts import Rollout, RolloutRequest, run_rollouts

__all__ = [
    "LocalRLOOTrainer",
    "Rollout",
    "RolloutBatch",
    "RolloutRequest",
    "UpdateMetrics",
    "default_actor_config",
    "pad_rollouts",
    "run_rollouts",
]
