"""``EmbeddedReplica``: verl's ``RolloutReplica`` for the embedded backend."""

from __future__ import annotations

from typing import Any

import ray

from rllm.errors import ConfigurationError
from rllm.training.verl.embedded import BACKEND_NAME, server_name
from rllm.training.verl.embedded.server import EmbeddedRolloutServer
from rllm.training.verl.verl_internals import call_on_actor, set_replica_servers


def _replica_base() -> type:
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


class EmbeddedReplica(_replica_base()):  # type: ignore[misc]
    """verl's ``RolloutReplica`` for the embedded backend: one server actor beside the replica's first worker."""

    def rollout_worker_use_gpu(self) -> bool:
        return True

    async def launch_servers(self) -> None:
        """Start this replica's server actor on its first worker's node, seeing that worker's device."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from verl.plugin.platform import get_platform
        from verl.utils.device import get_resource_name

        if self.nnodes != 1:
            raise ConfigurationError("the embedded rollout backend serves a replica from one node "
                                     "(tensor_model_parallel_size x data_parallel_size within a node)")
        if not self.workers:
            raise ConfigurationError("the embedded rollout backend runs colocated with the FSDP workers (hybrid "
                                     "engine)")
        resource = get_resource_name()

        def _where(worker: Any) -> tuple[str, str]:
            context = ray.get_runtime_context()
            return context.get_node_id(), str(context.get_accelerator_ids().get(resource, ["0"])[0])

        node_id, device_id = await call_on_actor(self.workers[0], lambda worker: _where(worker))
        platform = get_platform()
        env_vars = {var: "1" for var in platform.ray_noset_envvars()}
        device = platform.device_name
        if device == "cuda":
            env_vars[platform.visible_devices_envvar()] = device_id
        server = ray.remote(EmbeddedRolloutServer).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": env_vars},
            name=server_name(self.replica_rank),
            max_concurrency=self.max_concurrency,
            num_cpus=0,
        ).remote(self.config, self.model_config, self.replica_rank, "cuda" if device == "cuda" else "cpu")
        set_replica_servers(self, [server], f"{BACKEND_NAME}:{self.replica_rank}")
