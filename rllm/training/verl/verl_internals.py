"""Every place rllm reaches into verl's or Ray's internals, in one module, each pinned by a test.

The pinned verl offers public ways to add a rollout backend (``RolloutReplicaRegistry``), a trainer
(``register_trainer``), a platform (``PlatformRegistry``), an agent-loop manager (a config key) and a
task runner (``run_ppo``'s argument). What it does not offer, rllm takes from here and nowhere else:

* ``register_worker_rollout``: the FSDP workers' rollout registry, the private
  ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` dict (no register function exists);
* ``use_gloo_process_group``: ``verl.workers.engine_workers.initialize_global_process_group_ray``,
  the function the FSDP worker calls by name to start its process group (a CPU run needs gloo alone);
* ``TRAINER_STEP_HOOKS``: the private methods of verl's v1 trainer that the guarded trainer extends
  (``PPOTrainer._step_once`` calls them in this order), ``TRAINER_CALLBACKS``, the undocumented
  callbacks it extends, and ``trainer_tracker``, the trainer's metrics tracker (``self.logger``);
* ``as_sync_mode`` and ``SYNC_MODE``: verl's trainer compares its mode with ``"sync"``
  (``self.trainer_mode == "sync"``) to pick its synchronous replay buffer, so the guarded trainer
  (mode ``rllm_sync``) initialises under ``sync``;
* ``WORKER_HOOKS`` and ``WORKER_ATTRIBUTES``: the private methods and attribute of verl's TransferQueue
  agent-loop worker that the stopping manager extends and reads (a rollout whose ``run`` returns no
  sample reaches neither verl's reward function nor TransferQueue: ``_agent_loop_postprocess``
  returns first);
* ``use_agent_loop_worker`` and ``agent_loop_workers``: the agent-loop manager's
  ``agent_loop_workers_class`` (what ``create`` starts) and ``agent_loop_workers`` (the started
  actors), undocumented attributes of verl's ``AgentLoopManager``;
* ``set_replica_servers``: a ``RolloutReplica``'s ``servers`` and its private ``_server_handle`` and
  ``_server_address``, which ``launch_servers`` must set (verl's ``LLMServerManager`` reads the private
  names) and ``SERVER_METHODS``, what verl calls by name on a replica's server actor;
* ``ray_actor_class``: a Ray actor's Python class (``__ray_actor_class__``), to subclass verl's
  ``TaskRunnerV1`` and agent-loop worker;
* ``call_on_actor``: Ray's ``__ray_call__``, which runs a function on a live actor (the FSDP workers'
  node and device, their parameters' fingerprint);
* ``actor_module``: the FSDP actor's ``torch.nn.Module`` inside verl's fused worker
  (``WorkerDict.worker_dict[...]`` -> ``ActorRolloutRefWorker.actor.engine.module``);
* ``rollout_replicas``: the trainer's rollout replicas (``trainer.llm_server_manager.get_replicas()``),
  whose ``servers`` (Ray actors, the node-rank-0 one first) and ``server_address`` the served-weights
  check reads, with ``vLLMHttpServer.collective_rpc`` (``VLLM_SERVER_RPC``);
* ``TQ_*``: the v1 TransferQueue's row key, padding tag and field names that the training guards
  and the rollout-level RLOO read and write (``trainer/step_batch.py``, ``trainer/advantage.py``).

``check_verl_version`` is called when the plugin loads and again at launch, where a different verl
stops the run: verl logs a failed plugin import only at DEBUG, so a mismatch must be loud here.
``tests/rllm/training/verl/test_verl_internals.py`` has one test per seam that fails if verl renames
it or stops calling it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"
"""The verl release these seams are pinned against (the ``train`` extra installs it)."""
SYNC_MODE = "sync"
"""verl's synchronous trainer mode: its trainer checks ``self.trainer_mode == SYNC_MODE``."""
TRAINER_STEP_HOOKS = ("_compute_old_log_prob", "_compute_advantage", "_update_actor", "_compute_metrics")
"""Private methods of verl's v1 ``PPOTrainer`` the guarded trainer extends (``_step_once`` and ``fit`` call them)."""
TRAINER_CALLBACKS = ("prepare_step", "on_init_end", "on_step_end")
"""Undocumented callbacks of verl's v1 ``PPOTrainer`` that the guarded trainer extends (``step``, ``init``, ``fit``
call them)."""
WORKER_HOOKS = ("_run_agent_loop", "_agent_loop_postprocess")
"""Private methods of verl's ``AgentLoopWorkerTQ`` that ``StrandsAgentLoopWorker`` extends."""
WORKER_ATTRIBUTES = ("background_tasks",)
"""Private state of verl's ``AgentLoopWorkerTQ`` that ``StrandsAgentLoopWorker`` reads (the rollouts in flight)."""
SERVER_METHODS = ("generate", "wake_up", "sleep", "abort_all_requests", "resume_generation", "clear_kv_cache",
                  "release_kv_cache", "resume_kv_cache", "start_profile", "stop_profile")
"""What verl calls by name on a rollout replica's server actors (``RolloutReplica``, ``LLMServerClient``): the
embedded backend's ``EmbeddedRolloutServer`` answers each."""
ACTOR_ROLES = ("actor_rollout", "actor_rollout_ref")
"""Keys of the actor (with rollout, and with the reference policy) worker in verl's fused ``WorkerDict``
(``str(Role.ActorRollout)``, ``str(Role.ActorRolloutRef)``)."""

VLLM_SERVER_RPC = ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer", "collective_rpc",
                   ("self", "method", "timeout", "args", "kwargs"))
"""verl's vLLM server actor method that forwards a call to every vLLM worker (module, class, method, parameters);
pinned from verl's source, which imports only where vLLM is installed."""

TQ_ROW_KEY = "{uid}_{session_id}_{index}"
"""A row's key in verl's v1 TransferQueue (``AgentLoopWorkerTQ._agent_loop_postprocess``): ``uid`` the prompt's
group, ``session_id`` the rollout within it, ``index`` the agent-loop output (the sample) of the rollout."""
TQ_PADDING_TAG = "is_padding"
"""The tag verl's v1 trainer sets on a padding row of a batch (``KVBatchMeta.tags``)."""
TQ_UID, TQ_SESSION_ID, TQ_EXTRA_INFO = "uid", "session_id", "extra_info"
"""Row fields from the agent loop's keyword arguments: the prompt's group, the rollout, the dataset row's
``extra_info``."""
TQ_PROMPTS, TQ_RESPONSE_MASK, TQ_ROLLOUT_LOG_PROBS, TQ_RM_SCORES, TQ_EXTRA_FIELDS = (
    "prompts", "response_mask", "rollout_log_probs", "rm_scores", "extra_fields")
"""Row fields from ``AgentLoopOutput.as_dict``: prompt ids, the response's sampled-token mask, the log-probs the
tokens were sampled with, the reward on the last response token, and the loop's own ``extra_fields``."""
TQ_LOG_PROBS, TQ_OLD_LOG_PROBS = "log_probs", "old_log_probs"
"""What the actor's ``compute_log_prob`` writes, and where the trainer's ``_compute_old_log_prob`` moves it."""
TQ_ADVANTAGES, TQ_RETURNS = "advantages", "returns"
"""What the trainer's ``_compute_advantage`` writes back, in the nested layout."""
TQ_CALCULATE_ENTROPY, TQ_COMPUTE_LOSS, TQ_TEMPERATURE = "calculate_entropy", "compute_loss", "temperature"
"""``KVBatchMeta.extra_info`` keys the trainer sets before it asks the actor for log-probs (``compute_log_prob``)."""
TQ_ROW_INDEX = "index"
"""The dataset row's number in its ``extra_info`` (verl's ``RLHFDataset`` reads ``extra_info["index"]``)."""


def verl_version() -> str:
    """The installed verl's version ("" when verl is not installed)."""
    try:
        import verl
    except ImportError:
        return ""
    return str(getattr(verl, "__version__", ""))


def check_verl_version(*, strict: bool) -> str | None:
    """A message when the installed verl is not ``VERL_VERSION``; logged at ERROR, and raised when ``strict``.

    Raises ``rllm.errors.ConfigurationError`` with ``strict``; returns the message otherwise (``None``
    when the versions match).
    """
    found = verl_version()
    if found == VERL_VERSION:
        return None
    message = (f"rllm's verl integration is pinned to verl {VERL_VERSION} (its private registries, the trainer "
               f"methods it extends); verl {found or '(none)'} is installed: install rllm's train extra "
               f"(verl=={VERL_VERSION})")
    if strict:
        from rllm.errors import ConfigurationError

        raise ConfigurationError(message)
    logger.error("%s", message)
    return message


def register_worker_rollout(name: str, adapter_path: str) -> None:
    """Make ``rollout.name=name`` resolve to the ``BaseRollout`` at ``adapter_path`` inside every FSDP worker.

    The pinned verl's workers look it up in ``verl.workers.rollout.base._ROLLOUT_REGISTRY[(name, "async")]``
    (a private dict without a register function).
    """
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(name, "async")] = adapter_path


def _gloo_only(initialize: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(initialize)
    def wrapped(timeout_second: Any = None, backend: str | None = None) -> Any:
        return initialize(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    wrapped.__rllm_gloo_only__ = True  # type: ignore[attr-defined]
    return wrapped


def use_gloo_process_group() -> None:
    """Make verl's FSDP workers start a gloo-only process group (verl would ask for gloo on ``cpu`` twice).

    The pinned verl's ``verl.workers.engine_workers`` calls ``initialize_global_process_group_ray(timeout_second=None)``
    imported by name, which builds ``cpu:gloo,{device}:{backend}``; with device ``cpu`` torch refuses
    ``cpu:gloo,cpu:gloo``. This replaces that name in that module only, with a wrapper passing
    ``backend="cpu:gloo"``.
    """
    import verl.workers.engine_workers as engine_workers

    current = engine_workers.initialize_global_process_group_ray
    if not getattr(current, "__rllm_gloo_only__", False):
        engine_workers.initialize_global_process_group_ray = _gloo_only(current)


def ray_actor_class(actor: Any) -> type:
    """The Python class behind a ``@ray.remote`` class (Ray keeps it as ``__ray_actor_class__``)."""
    cls = getattr(actor, "__ray_actor_class__", None)
    if not isinstance(cls, type):
        raise TypeError(f"{actor!r} is not a Ray actor class")
    return cls


def call_on_actor(handle: Any, function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(instance, *args)`` on a live Ray actor (Ray's ``__ray_call__``); its object ref."""
    return handle.__ray_call__.remote(function, *args)


def vllm_collective_rpc(server: Any, function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(worker, *args)`` in every vLLM worker behind verl's server actor; its object ref."""
    return getattr(server, VLLM_SERVER_RPC[2]).remote(function, args=args)


def actor_module(fused_worker: Any) -> Any:
    """The FSDP actor's module inside verl's fused worker (``WorkerDict``), for the actor-side weight fingerprint."""
    role = next(role for role in ACTOR_ROLES if role in fused_worker.worker_dict)
    return fused_worker.worker_dict[role].actor.engine.module


def rollout_replicas(trainer: Any) -> list[Any]:
    """The rollout replicas verl's v1 trainer serves from (``RolloutReplica``: ``servers``, ``server_address``)."""
    return list(trainer.llm_server_manager.get_replicas())


@contextlib.contextmanager
def as_sync_mode(config: Any) -> Iterator[None]:
    """The config's ``trainer.v1.trainer_mode`` set to ``SYNC_MODE`` while verl's trainer initialises, then restored.

    verl's ``PPOTrainer.__init__`` keeps the mode (``self.trainer_mode``) and picks its synchronous replay
    buffer, and later its synchronous checkpoint and refill rules, by comparing it with ``"sync"``.
    """
    mode = config.trainer.v1.trainer_mode
    config.trainer.v1.trainer_mode = SYNC_MODE
    try:
        yield
    finally:
        config.trainer.v1.trainer_mode = mode


def trainer_tracker(trainer: Any) -> Any | None:
    """The trainer's metrics tracker (verl's ``Tracking``, made by ``fit``); ``None`` before ``fit`` made it."""
    return getattr(trainer, "logger", None)


def use_agent_loop_worker(manager: Any, worker_cls: type) -> None:
    """Make verl's agent-loop manager start ``worker_cls`` (a plain class) as its Ray workers.

    The pinned verl's ``AgentLoopManager.create`` builds the manager, then starts
    ``manager.agent_loop_workers_class`` (an undocumented attribute), so setting it in ``__init__`` suffices.
    """
    import ray

    manager.agent_loop_workers_class = ray.remote(worker_cls)


def agent_loop_workers(manager: Any) -> list[Any]:
    """The Ray actors verl's agent-loop manager started (``manager.agent_loop_workers``), in verl's order."""
    return list(manager.agent_loop_workers)


def set_replica_servers(replica: Any, servers: list[Any], address: str) -> None:
    """What a ``RolloutReplica.launch_servers`` leaves behind: its server actors, the first one leading, and address.

    verl's ``LLMServerManager`` reads the private ``_server_handle`` and ``_server_address`` of each
    replica (its load balancer routes ``generate`` calls to that handle under that address), and
    ``RolloutReplica`` forwards ``wake_up``, ``sleep``, ... to every one of ``servers``.
    """
    replica.servers = list(servers)
    replica._server_handle = replica.servers[0]
    replica._server_address = address
