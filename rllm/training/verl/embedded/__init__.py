"""The embedded rollout backend for verl: ``rollout.name=rllm_embedded`` serves the policy with ``TransformersEngine``.

The pinned verl ships vLLM, SGLang and TensorRT-LLM backends; none installs on a laptop or beside
torch alone on one GPU. This backend needs only torch and transformers. It has verl's three parts:

* ``EmbeddedReplica`` (``replica.py``, a verl ``RolloutReplica``): launches one
  ``EmbeddedRolloutServer`` Ray actor per replica, on the node and device of its first FSDP worker.
* ``EmbeddedRolloutServer`` (``server.py``): token-in/token-out ``generate`` (what verl's
  ``LLMServerClient`` calls) over a ``TransformersEngine`` (continuous batching, one log-prob per
  sampled token, from the same processed scores it was sampled from); ``sleep``/``wake_up`` move the
  weights off and back onto the GPU; ``abort_all_requests`` cancels what is in flight; weights arrive
  in buckets from the adapter, every parameter must be covered, and ``weights_fingerprint`` gives the
  served weights' fingerprint (``rllm.training.verl.weights.fingerprint``) for the trainer to compare with
  the actor's own after every sync.
* ``EmbeddedServerAdapter`` (``adapter.py``, a verl ``BaseRollout``, inside each FSDP worker): verl's
  own naive sync (``ActorRolloutRefWorker.update_weights``) hands it the actor's full tensors; every
  rank drains the generator (gathering them is collective) and the replica's first rank sends them
  to its server through Ray's object store, cast to the serving dtype.

``rllm.training.verl.plugin`` registers the replica in verl's public ``RolloutReplicaRegistry`` and
the adapter in the workers' private registry (``rllm.training.verl.verl_internals``). This module
holds only names, so the plugin imports it without loading the backend.
"""

from __future__ import annotations

BACKEND_NAME = "rllm_embedded"
"""``actor_rollout_ref.rollout.name`` of the embedded backend."""
ADAPTER_PATH = "rllm.training.verl.embedded.adapter.EmbeddedServerAdapter"
"""Where each FSDP worker finds the backend's ``BaseRollout`` (verl imports it by this path)."""

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def serving_dtype(name: str) -> object:
    """The torch dtype of ``rollout.dtype``; a clear error for one this backend does not serve."""
    import torch

    from rllm.errors import ConfigurationError

    try:
        return getattr(torch, _DTYPES[str(name).lower()])
    except KeyError:
        raise ConfigurationError(f"actor_rollout_ref.rollout.dtype={name!r}: the embedded backend serves "
                                 f"{sorted(set(_DTYPES))}") from None


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (the adapter and the trainer find it by this name)."""
    return f"rllm_embedded_server_{replica_rank}"
