"""What ``import verl`` loads from rllm in every process of a run: the embedded rollout backend and the CPU mode.

rllm declares this module as a ``verl.plugins`` entry point (pyproject.toml), which verl 0.9.1
imports at the end of ``verl/__init__.py`` in the driver, the task runner and every Ray worker, so a
normal ``pip install`` is enough. Importing it:

* registers ``rollout.name=rllm_embedded`` in verl's public ``RolloutReplicaRegistry`` and, since
  verl offers no public way, in the private ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` dict
  that each FSDP worker reads (``tests/rllm/training/verl/test_plugin.py`` fails when verl changes
  either);
* registers ``trainer.v1.trainer_mode=rllm_sync``, verl's synchronous trainer with the guards of
  ``rllm.training.verl.guards``, in verl's public trainer registry (lazily, when verl's trainer
  module is imported, since it is heavy);
* in a CPU run (``RLLM_VERL_CPU=1``, see ``rllm.training.verl.cpu``) registers the CPU platform.

Nothing here is imported by rllm itself; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns it off.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

BACKEND_NAME = "rllm_embedded"
"""``actor_rollout_ref.rollout.name`` of the embedded backend."""
ADAPTER_PATH = "rllm.training.verl.embedded_rollout.EmbeddedServerAdapter"
"""Where each FSDP worker finds the backend's ``BaseRollout`` (verl imports it by this path)."""


def _load_replica() -> type:
    from rllm.training.verl.embedded_rollout import EmbeddedReplica

    return EmbeddedReplica


def register_rollout_backend() -> None:
    """Make ``rollout.name=rllm_embedded`` known to verl's replica registry and its workers' rollout registry."""
    from verl.workers.rollout import base, replica

    replica.RolloutReplicaRegistry.register(BACKEND_NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(BACKEND_NAME, "async")] = ADAPTER_PATH


def register() -> None:
    """Everything this plugin registers; safe to call more than once."""
    from rllm.training.verl import cpu

    register_rollout_backend()
    if cpu.cpu_mode():
        cpu.activate()


register()
