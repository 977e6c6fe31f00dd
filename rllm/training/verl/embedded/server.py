"""``EmbeddedRolloutServer``: a ``TransformersEngine`` behind verl's rollout-server interface (a Ray actor)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from rllm.errors import ConfigurationError, WeightSyncError
from rllm.training.verl.embedded import serving_dtype
from rllm.training.verl.weights.fingerprint import WeightFingerprint

logger = logging.getLogger(__name__)


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
        self.dtype: Any = serving_dtype(config.dtype)
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
        self._received: dict[str, str] = {}
        self._expected: list[str] = []
        self._parameter_names = self._own_parameter_names()
        self._by_sent_name = self._sent_names()
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

    def _sent_names(self) -> dict[str, str]:
        """Each name a sync may send a tensor under (``_sent_name``) -> the served model's state-dict name."""
        return {_sent_name(name): name for name in self.engine.model.state_dict()}

    # ---------------------------------------------------------------- generation
    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> Any:
        """Sample after ``prompt_ids`` with verl's sampling parameters; an aborted request says so."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise ConfigurationError("the embedded rollout backend serves text-only policies")
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
    async def begin_weight_update(self, peft_config: dict[str, Any] | None = None, part: str = "full") -> None:
        """Start a sync of ``part``: ``full`` weights, or with LoRA the frozen ``base`` or the ``adapter``.

        The first LoRA sync wraps the served model in the adapter verl trains (``peft_config``, peft's
        own ``get_peft_model``), so the server serves base plus adapter under the actor's own names.
        Every tensor of ``part`` must then arrive before ``finish_weight_update``.
        """
        if peft_config is not None and not self._serves_adapter:
            self._wrap_in_adapter(peft_config)
        if part == "full" and self._serves_adapter:
            raise WeightSyncError("the actor sent whole weights to a server that serves base plus a LoRA adapter")
        if part not in {"full", "base", "adapter"}:
            raise WeightSyncError(f"unknown weight-sync part {part!r}")
        self._expected = [name for name in self._parameter_names
                          if part == "full" or (_is_adapter(name) == (part == "adapter"))]
        self._received = {}

    @property
    def _serves_adapter(self) -> bool:
        return any(_is_adapter(name) for name in self._parameter_names)

    def _wrap_in_adapter(self, peft_config: dict[str, Any]) -> None:
        """Serve ``model`` plus the LoRA adapter ``peft_config`` describes, every tensor in the serving dtype."""
        from peft import LoraConfig, get_peft_model

        fields = {key: value for key, value in peft_config.items() if key in LoraConfig.__dataclass_fields__}
        fields["inference_mode"] = True
        model = get_peft_model(self.engine.model, LoraConfig(**fields)).to(self.dtype)
        model.eval()
        self.engine.model = model
        self._parameter_names = self._own_parameter_names()
        self._by_sent_name = self._sent_names()
        logger.info("embedded rollout server %d: serving base plus a rank-%s LoRA adapter (%d adapter tensors)",
                    self.replica_rank, fields.get("r"), sum(_is_adapter(n) for n in self._parameter_names))

    async def load_weights(self, bucket: dict[str, torch.Tensor]) -> None:
        """Copy one bucket of the actor's tensors into the served model (names as verl sends them)."""
        state = self.engine.model.state_dict()
        unknown = sorted(name for name in bucket if self._by_sent_name.get(_sent_name(name)) not in state)
        if unknown:
            raise WeightSyncError(f"the actor sent tensors the served model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in bucket.items():
                own = self._by_sent_name[_sent_name(name)]
                target = state[own]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise WeightSyncError(f"{name}: the actor sent shape {tuple(tensor.shape)}, "
                                          f"the served model has {tuple(target.shape)}")
                target.copy_(tensor.to(target.device, target.dtype))
                self._received[name] = own

    async def finish_weight_update(self, global_steps: int | None, sent: str) -> dict[str, Any]:
        """End a sync: every tensor of the part received, and what arrived equal to what was sent (transport check).

        That the actor sent its current weights is not this check's business: the trainer compares
        ``weights_fingerprint`` with the actor's own after every sync (``rllm.training.verl.trainer.runner``).
        """
        arrived = set(self._received.values())
        missing = [n for n in self._expected if n not in arrived]
        if missing:
            raise WeightSyncError(f"the sync left {len(missing)} parameters of the served model unchanged: "
                                  f"{missing[:5]}")
        state = self.engine.model.state_dict()
        received = WeightFingerprint.of((name, state[self._received[name]]) for name in sorted(self._received)).digest
        if received != sent:
            raise WeightSyncError(f"the weights of step {global_steps} arrived at the rollout server changed "
                                  f"(fingerprint {received[:12]} != {sent[:12]} as sent)")
        self.weights_version = global_steps
        logger.info("embedded rollout server %d: weights of step %s loaded (%d tensors, fingerprint %s)",
                    self.replica_rank, global_steps, len(self._received), received[:12])
        return {"global_steps": global_steps, "tensors": len(self._received), "fingerprint": received}

    async def weights_fingerprint(self) -> dict[str, str]:
        """Per served parameter (a tied weight once), the digest of its value now, as it is served."""
        state = self.engine.model.state_dict()
        return WeightFingerprint.of((name, state[name]) for name in self._parameter_names).tensors


_ADAPTER_NAME = ".default."
"""peft's name for the one adapter verl trains, inside its parameters' names."""


def _is_adapter(name: str) -> bool:
    """Whether served parameter ``name`` belongs to the LoRA adapter (``lora_A``/``lora_B`` of peft)."""
    return ".lora_" in name


def _sent_name(name: str) -> str:
    """One name for a served parameter, whichever of verl's names for it a sync uses.

    verl's LoRA sync sends the adapter as peft saves it (``get_peft_model_state_dict``: the adapter
    name dropped) and the frozen base, once, as vLLM's LoRA models name it (``collect_lora_params``:
    ``base_model.model.`` dropped, ``.base_layer`` kept on the modules it takes for targets); a
    merged or full sync sends the checkpoint's names. All of them, and the served model's own, map here.
    """
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    return name.replace(_ADAPTER_NAME, ".") if _is_adapter(name) else name
