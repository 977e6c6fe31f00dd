"""Secrets for the rollout workers (the retrieval server's token) through Ray, never through a config, a log or a file.

verl prints its resolved config and hands it to every tracker, and Ray writes a job's
``runtime_env`` (environment variables included) into its session logs
(``runtime_env_agent.log``). So the launcher keeps the secret out of both: it puts it in a small
Ray actor (``share_secrets``), and each rollout worker copies it into its own environment before it
builds the agent's tools (``receive_secrets``), where the tools read it as they always do
(``local_search`` reads ``RETRIEVAL_TOKEN``). It works the same on one machine and on a multi-node
cluster, since every worker reaches the actor by name; a worker that already has the variable
(Ray workers on the launcher's machine inherit its environment) keeps its own.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

SECRET_ENV_VARS = ("RETRIEVAL_TOKEN",)
"""Environment variables the rollout workers need and no config may carry."""
STORE_NAME = "rllm_rollout_secrets"
"""The Ray actor that holds them for the run."""


class _SecretStore:
    """Holds the run's secrets in one Ray actor; they never leave it but to a worker that asks."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def put(self, values: dict[str, str]) -> int:
        self._values.update(values)
        return len(self._values)

    def get(self) -> dict[str, str]:
        return dict(self._values)


def share_secrets(names: tuple[str, ...] = SECRET_ENV_VARS) -> Any:
    """Put this process's values of ``names`` in the run's secret store; the store's handle (keep it for the run).

    Call after ``ray.init``. Returns ``None`` when none of ``names`` is set.
    """
    import ray

    values = {name: os.environ[name] for name in names if os.environ.get(name)}
    if not values:
        return None
    actor: Any = ray.remote(_SecretStore)
    store = actor.options(name=STORE_NAME, num_cpus=0, get_if_exists=True).remote()
    ray.get(store.put.remote(values))
    logger.info("secrets for the rollout workers: %s (values not shown)", ", ".join(sorted(values)))
    return store


@functools.cache
def receive_secrets(names: tuple[str, ...] = SECRET_ENV_VARS) -> tuple[str, ...]:
    """Copy the run's secrets into this worker's environment where it lacks them; the names set (once per process)."""
    if all(os.environ.get(name) for name in names):
        return ()
    import ray

    if not ray.is_initialized():
        return ()
    try:
        store = ray.get_actor(STORE_NAME)
    except ValueError:  # no secret was shared for this run
        return ()
    received = []
    for name, value in ray.get(store.get.remote()).items():
        if name in names and not os.environ.get(name):
            os.environ[name] = value
            received.append(name)
    return tuple(received)
