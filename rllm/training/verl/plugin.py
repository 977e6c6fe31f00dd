"""What ``import verl`` loads from rllm in every process of a run: the embedded rollout backend and the CPU mode.

rllm declares this module as a ``verl.plugins`` entry point (pyproject.toml), which the pinned verl
imports at the end of ``verl/__init__.py`` in the driver, the task runner and every Ray worker, so a
normal ``pip install`` is enough. Importing it:

* checks that the installed verl is the one rllm's seams are pinned to (``verl_internals``), and
  says so at ERROR when it is not (verl logs a failed plugin import only at DEBUG; the launcher
  refuses the run);
* registers ``rollout.name=rllm_embedded`` (``rllm.training.verl.embedded``) in verl's public
  ``RolloutReplicaRegistry`` and in the FSDP workers' private rollout registry;
* in a CPU run (``RLLM_VERL_CPU=1``, see ``rllm.training.verl.cpu``) registers the CPU platform.

The guarded trainer (``trainer.v1.trainer_mode=rllm_sync``) is registered by ``rllm.training.verl.trainer.runner``
in the task runner's process, where verl looks trainers up. Nothing here is imported by rllm itself;
``VERL_USE_EXTERNAL_PLUGINS=none`` turns it off.
"""

from __future__ import annotations

import logging

from rllm.training.verl.embedded import ADAPTER_PATH, BACKEND_NAME

logger = logging.getLogger(__name__)


def _load_replica() -> type:
    from rllm.training.verl.embedded.replica import EmbeddedReplica

    return EmbeddedReplica


def register_rollout_backend() -> None:
    """Make ``rollout.name=rllm_embedded`` known to verl's replica registry and its workers' rollout registry."""
    from verl.workers.rollout import replica

    from rllm.training.verl.verl_internals import register_worker_rollout

    replica.RolloutReplicaRegistry.register(BACKEND_NAME, _load_replica)
    register_worker_rollout(BACKEND_NAME, ADAPTER_PATH)


def register() -> None:
    """Everything this plugin registers; safe to call more than once."""
    from rllm.training.verl import cpu
    from rllm.training.verl.verl_internals import check_verl_version

    check_verl_version(strict=False)
    register_rollout_backend()
    if cpu.cpu_mode():
        cpu.activate()


register()
