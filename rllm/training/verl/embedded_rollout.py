"""The embedded rollout backend for verl: ``rollout.name=rllm_embedded`` serves the policy with ``TransformersEngine``.

verl 0.9.1 ships vLLM, SGLang and TensorRT-LLM backends; none installs on a laptop or beside
torch alone on one GPU. This backend needs only torch and transformers. It has verl's three parts:

* ``EmbeddedReplica`` (a verl ``RolloutReplica``): launches one ``EmbeddedRolloutServer`` Ray
  actor per replica, on the node and device of the replica's first FSDP worker.
* ``EmbeddedRolloutServer``: token-in/token-out ``generate`` (what verl's ``LLMServerClient``
  calls) over a ``TransformersEngine`` (continuous batching, one log-prob per sampled token, from
  the same processed scores it was sampled from); ``sleep``/``wake_up`` move the weights off and
  back onto the GPU; ``abort_all_requests`` cancels what is in flight (the engine drops the
  sequences from its batch); weights arrive in buckets from the adapter and are checked: every
  parameter covered, and a checksum equal to the one of what the actor sent.
* ``EmbeddedServerAdapter`` (a verl ``BaseRollout``, inside each FSDP worker): verl's own naive
  sync (``ActorRolloutRefWorker.update_weights``) hands it the actor's full tensors; every rank
  drains the generator (gathering them is collective) and the replica's first rank sends them to
  its server through Ray's object store, cast to the serving dtype.

``rllm.training.verl.plugin`` registers the replica in verl's public ``RolloutReplicaRegistry`` and
the adapter in verl's private ``_ROLLOUT_REGISTRY`` (no public way exists; a test pins it).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable
from typing import Any

import ray
import torch

from rllm.errors import WeightSyncError
from rllm.training.verl.plugin import BACKEND_NAME

logger = logging.getLogger(__name__)

_BUCKET_BYTES = 512 << 20
"""Weights sent to the server per Ray call: bounds the copies held at once."""

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def serving_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``rollout.dtype``; a clear error for one this backend does not serve."""
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"actor_rollout_ref.rollout.dtype={name!r}: the embedded backend serves "
                         f"{sorted(set(_DTYPES))}") from None


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (the adapter finds its server by it)."""
    return f"rllm_embedded_server_{replica_rank}"


class WeightChecksum:
    """An exact digest of named tensors: sha256 over each tensor's name, shape, dtype and raw bytes, by name.

    Both ends hash the same values in the serving dtype, so equal weights give equal digests bit for
    bit, whatever the thread count or device, and a stale, partly loaded or permuted tensor does not.
    """

    def __init__(self) -> None:
        self._parts: dict[str, bytes] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        values = tensor.detach().to("cpu").contiguous()
        digest = hashlib.sha256(b"%s|%s|%s|" % (name.encode(), str(tuple(values.shape)).encode(),
                                                str(values.dtype).encode()))
        digest.update(values.view(torch.uint8).numpy().tobytes() if values.numel() else b"")
        self._parts[name] = digest.digest()

    @property
    def hexdigest(self) -> str:
        digest = hashlib.sha256()
        for name in sorted(self._parts):
            digest.update(self._parts[name])
        return digest.hexdigest()

    @classmethod
    def of_module(cls, module: torch.nn.Module, names: Iterable[str]) -> WeightChecksum:
        state = module.state_dict()
        checksum = cls()
        for name in names:
            checksum.add(name, state[name])
        return checksum


class EmbeddedRolloutServer:
    """A ``TransformersEngine`` behind verl's rollout-server interface (a Ray actor).

    Args:
        config: verl's ``RolloutConfig`` (``dtype``, ``max_model_len``, ``max_num_seqs``,
            ``prompt_length``, ``response_length``).
        model_config: verl's ``HFModelConfig`` (``local_path`` of the policy).
        replica_rank: This replica's rank.
        device: ``cuda`` or ``cpu``; default: ``cuda`` when torch sees one.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, device: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        from rllm.engine.rollout.transformers_engine import TransformersEngine

        config = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = serving_dtype(config.dtype)
        path = model_config.local_path
        attention = (getattr(model_config, "override_config", None) or {}).get("attn_implementation", "sdpa")
        if attention not in {"sdpa", "eager"}:
            attention = "sdpa"  # flash attention is the trainer's business; the engine pads its batches
        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype, attn_implementation=attention)
        remote_code = bool(getattr(model_config, "trust_remote_code", False))
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote_code)
        context = int(config.max_model_len or (int(config.prompt_length) + int(config.response_length)))
        self.engine = TransformersEngine(model, tokenizer, device=self.device,
                                         max_batch_size=int(getattr(config, "max_num_seqs", 0) or 256),
                                         context_length=context)
        self.free_cache_engine = bool(getattr(config, "free_cache_engine", True))
        self.weights_version: int | None = None
        self.last_sync: dict[str, Any] = {}
        self._received: set[str] = set()
        self._parameter_names = self._own_parameter_names()
        self._inflight = 0
        self._rejecting = False
        self._asleep = False
        logger.info("embedded rollout server %d: %s on %s in %s", replica_rank, path, self.device, self.dtype)

    def _own_parameter_names(self) -> list[str]:
        """State-dict names of every distinct parameter (a tied weight once, under its first name)."""
        seen: set[int] = set()
        names = []
        for name, parameter in self.engine.model.named_parameters(remove_duplicate=False):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                names.append(name)
        return names

    # ---------------------------------------------------------------- generation
    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> Any:
        """Sample after ``prompt_ids`` with verl's sampling parameters; an aborted request says so."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise ValueError("the embedded rollout backend serves text-only policies")
        extra = {"global_steps": self.weights_version}
        if self._rejecting:
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        if self._asleep:  # a request between sleep and the next sync (validation, say): serve it, weights back on
            await self.wake_up()
        room = self.engine.context_length - len(prompt_ids)
        max_tokens = int(sampling_params.get("max_tokens") or room)
        sampling = {"temperature": float(sampling_params.get("temperature", 1.0)),
                    "top_p": float(sampling_params.get("top_p", 1.0)),
                    "top_k": max(int(sampling_params.get("top_k", 0) or 0), 0)}
        if sampling_params.get("seed") is not None:
            sampling["seed"] = int(sampling_params["seed"])
        self._inflight += 1
        try:
            output = await self.engine.sample(prompt_ids, min(max_tokens, room), **sampling)
        finally:
            self._inflight -= 1
        stop = "aborted" if output.finish_reason == "abort" else "completed"
        log_probs = list(output.logprobs or []) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=list(output.token_ids), log_probs=log_probs, stop_reason=stop, num_preempted=0,
                           extra_fields=extra)

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Abort every request in flight (each leaves the batch with what it sampled); optionally refuse new ones."""
        self._rejecting = bool(reject_request)
        self.engine.abort()

    async def resume_generation(self) -> None:
        """Accept requests again after ``abort_all_requests(reject_request=True)``."""
        self._rejecting = False

    async def num_inflight(self) -> int:
        """Requests being served now."""
        return self._inflight

    # ---------------------------------------------------------------- memory
    async def sleep(self) -> None:
        """Free the device memory the weights hold (moved to host memory) until ``wake_up``."""
        if self.device != "cpu" and self.free_cache_engine:
            self.engine.model.to("cpu")
            torch.cuda.empty_cache()
        self._asleep = True

    async def wake_up(self) -> None:
        """Put the weights back on the device."""
        if self.device != "cpu":
            self.engine.model.to(self.device)
        self._asleep = False

    async def device_memory_bytes(self) -> int:
        """Bytes of device memory torch holds in this process (0 on CPU)."""
        return int(torch.cuda.memory_allocated()) if self.device != "cpu" else 0

    async def clear_kv_cache(self) -> None:
        """Nothing to clear: the engine keeps no cache across requests."""

    async def release_kv_cache(self) -> None:
        """Nothing to release: a request's cache is freed when it finishes."""

    async def resume_kv_cache(self) -> None:
        """Nothing to restore."""

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling is not supported by this backend."""

    async def stop_profile(self) -> None:
        """Profiling is not supported by this backend."""

    # ---------------------------------------------------------------- weights
    async def begin_weight_update(self) -> None:
        """Start a sync: the weights must all arrive before ``finish_weight_update``."""
        self._received = set()

    async def load_weights(self, bucket: dict[str, torch.Tensor]) -> None:
        """Copy one bucket of the actor's tensors into the served model (names must be the model's)."""
        state = self.engine.model.state_dict()
        unknown = sorted(set(bucket) - set(state))
        if unknown:
            raise WeightSyncError(f"the actor sent tensors the served model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in bucket.items():
                target = state[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise WeightSyncError(f"{name}: the actor sent shape {tuple(tensor.shape)}, "
                                          f"the served model has {tuple(target.shape)}")
                target.copy_(tensor.to(target.device, target.dtype))
        self._received.update(bucket)

    async def finish_weight_update(self, global_steps: int | None, expected: str) -> dict[str, Any]:
        """End a sync: every parameter received and the served weights' checksum equal to what was sent."""
        missing = [n for n in self._parameter_names if n not in self._received]
        if missing:
            raise WeightSyncError(f"the sync left {len(missing)} parameters of the served model unchanged: "
                                  f"{missing[:5]}")
        served = WeightChecksum.of_module(self.engine.model, sorted(self._received)).hexdigest
        self.weights_version = global_steps
        self.last_sync = {"global_steps": global_steps, "expected": expected, "served": served,
                          "match": served == expected, "tensors": len(self._received)}
        if served != expected:
            raise WeightSyncError(f"after the sync of step {global_steps} the served weights differ from the "
                                  f"actor's (checksum {served[:12]} != {expected[:12]})")
        logger.info("embedded rollout server %d: weights of step %s loaded (%d tensors, checksum %s)",
                    self.replica_rank, global_steps, len(self._received), served[:12])
        return dict(self.last_sync)

    async def sync_report(self) -> dict[str, Any]:
        """The last sync: step, the actor's and the served checksum, whether they match."""
        return dict(self.last_sync)

    async def weights_checksum(self) -> str:
        """The checksum of every served parameter, now."""
        return WeightChecksum.of_module(self.engine.model, self._parameter_names).hexdigest


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
            raise ValueError("the embedded rollout backend serves a replica from one node "
                             "(tensor_model_parallel_size x data_parallel_size within a node)")
        if not self.workers:
            raise ValueError("the embedded rollout backend runs colocated with the FSDP workers (hybrid engine)")
        resource = get_resource_name()

        def _where(worker: Any) -> tuple[str, str]:
            context = ray.get_runtime_context()
            return context.get_node_id(), str(context.get_accelerator_ids().get(resource, ["0"])[0])

        node_id, device_id = await self.workers[0].__ray_call__.remote(lambda self: _where(self))
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
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{BACKEND_NAME}:{self.replica_rank}"


def _rollout_base() -> type:
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class EmbeddedServerAdapter(_rollout_base()):  # type: ignore[misc]
    """verl's ``BaseRollout`` for the embedded backend, in each FSDP worker: weights to the server, memory control."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        self.dtype = serving_dtype(self.config.dtype)
        replica_size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                        * self.config.pipeline_model_parallel_size)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank, self.is_leader = rank // replica_size, rank % replica_size == 0
        self._server: Any = None

    @property
    def server(self) -> Any:
        """The replica's server actor (found by name: it is started after the workers)."""
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Put the weights back on the device before a sync (``weights``); the cache needs nothing."""
        if self.is_leader and "weights" in tags:
            await self.server.wake_up.remote()

    async def release(self) -> None:
        """Free the server's device memory."""
        if self.is_leader:
            await self.server.sleep.remote()

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        """Send the actor's full tensors to the server in buckets, then check the server's weights equal them.

        Every rank drains ``weights`` (verl gathers each tensor collectively); only the replica's
        first rank sends. A LoRA adapter or a delta flush is refused with a clear error.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the embedded rollout backend takes full tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the embedded rollout backend serves merged weights: set "
                                      "actor_rollout_ref.model.lora.merge=true")
        checksum = WeightChecksum()
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        if self.is_leader:
            await self.server.begin_weight_update.remote()
        for name, tensor in weights:
            if not self.is_leader:
                continue
            served = tensor.detach().to("cpu", self.dtype, copy=True)
            checksum.add(name, served)
            bucket[name] = served
            size += served.numel() * served.element_size()
            if size >= _BUCKET_BYTES:
                await self.server.load_weights.remote(bucket)
                bucket, size = {}, 0
        if not self.is_leader:
            return
        if bucket:
            await self.server.load_weights.remote(bucket)
        await self.server.finish_weight_update.remote(kwargs.get("global_steps"), checksum.hexdigest)


def checksum_matches(report: dict[str, Any]) -> float:
    """1.0 when a sync report says the served weights equal the actor's, 0.0 when not, NaN before any sync."""
    if not report:
        return math.nan
    return 1.0 if report.get("match") else 0.0


__all__ = [
    "BACKEND_NAME",
    "EmbeddedReplica",
    "EmbeddedRolloutServer",
    "EmbeddedServerAdapter",
    "WeightChecksum",
    "WeightSyncError",
    "checksum_matches",
    "server_name",
    "serving_dtype",
]
