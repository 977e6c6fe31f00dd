"""What a vLLM or SGLang rollout replica serves, read where the weights are, for the served-weights check.

vLLM (``rollout.name=vllm``): a function rllm sends through verl's ``vLLMHttpServer.collective_rpc``
runs in every vLLM worker. With one tensor-parallel rank it splits vLLM's fused tensors back into
the checkpoint's (``qkv_proj`` into ``q_proj``/``k_proj``/``v_proj`` by the layer's ``output_sizes``,
``gate_up_proj`` likewise, by the model's own ``packed_modules_mapping``; padded vocabulary rows
dropped) and fingerprints each exactly as the actor does (``rllm.training.verl.weights.fingerprint``): the two
are compared value for value. With several ranks each worker fingerprints its own shards under
vLLM's names, and the replica's tensors are compared for change only (below). verl's
``collective_rpc`` returns nothing, so each worker writes its answer to a file on its node and rllm
reads the files back through the replica's server actors (Ray's ``__ray_call__``). vLLM sends a
function to its workers only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (pickle between the
engine's own processes); the vLLM recipe sets it and the launcher refuses a vLLM run without it.

SGLang (``rollout.name=sglang``): SGLang's own ``POST /weights_checker {"action": "checksum"}``
(sglang 0.5.12, the release the pinned verl pins) answers, per rank, a hash of every tensor under
SGLang's names, computed on the GPU by SGLang; rllm cannot compute the same hash of the actor's
tensors, so these are compared for change only.

Compared for change (``ServedWeights.exact`` false): after every sync each served tensor must have
changed exactly when the actor parameters it is made of changed (in the serving dtype). A sync that
re-sends old tensors, skips one or stops arriving is caught; a wrong value that still changes is not.

Neither engine installs on the machines this was written on (no GPU; the lent GPU machines cannot
install them either): these readers are tested here on stand-ins built from a real Qwen3 model and
on SGLang's answer as sglang 0.5.12's code writes it, not against a running engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from rllm.errors import TrainingGuardError
from rllm.training.verl.verl_internals import call_on_actor, vllm_collective_rpc
from rllm.training.verl.weights.fingerprint import WeightFingerprint, tensor_digest
from rllm.transport import open_sync_client

PACKED_MODULES: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                              "gate_up_proj": ("gate_proj", "up_proj")}
"""The fused modules vLLM's and SGLang's dense models share (their ``packed_modules_mapping``), by fused name."""
TIED: dict[str, str] = {"lm_head.weight": "model.embed_tokens.weight"}
"""A served tensor that is another parameter of the actor when the model ties its embeddings."""
FILE_SUFFIX = ".rllm-weights.json"
VLLM_RPC_ENV = "VLLM_ALLOW_INSECURE_SERIALIZATION"
"""vLLM sends a function to its workers (``collective_rpc``) only with this set to ``1``."""


@dataclass
class ServedWeights:
    """What one rollout replica reports of the weights it serves.

    Attributes:
        fingerprint: Per tensor name, a digest.
        exact: True: names and digests are the actor's (``tensor_digest`` of each checkpoint tensor), compared
            value for value; False: the engine's own names and digests, compared only for change.
        packed: Fused module name -> the checkpoint modules it holds, to map an engine name to the actor's.
    """

    fingerprint: WeightFingerprint
    exact: bool = True
    packed: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(PACKED_MODULES))

    def actor_parts(self, name: str, actor_names: Mapping[str, Any]) -> list[str] | None:
        """The actor parameters served tensor ``name`` is made of (``None``: rllm cannot tell)."""
        if name in actor_names:
            return [name]
        module, _, leaf = name.rpartition(".")
        prefix, _, fused = module.rpartition(".")
        if fused in self.packed:
            parts = [f"{prefix}.{part}.{leaf}" if prefix else f"{part}.{leaf}" for part in self.packed[fused]]
            if all(part in actor_names for part in parts):
                return parts
        tied = TIED.get(name)
        return [tied] if tied is not None and tied in actor_names else None


# ---------------------------------------------------------------------------------------------- vLLM
def unfused_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A single-rank vLLM model's parameters under the checkpoint's names, fused tensors split back.

    A parameter of a module named in ``model.packed_modules_mapping`` whose layer has as many
    ``output_sizes`` as parts is split along its rows; an embedding padded past ``org_vocab_size``
    loses the padding rows; anything else is yielded as it is.
    """
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    modules = dict(model.named_modules())
    for name, parameter in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        module = modules.get(module_name)
        prefix, _, fused = module_name.rpartition(".")
        parts = packed.get(fused)
        sizes = list(getattr(module, "output_sizes", None) or [])
        tensor = parameter.detach()
        if parts and len(parts) == len(sizes) and sum(sizes) == tensor.shape[0]:
            for part, chunk in zip(parts, tensor.split(sizes, dim=0), strict=True):
                yield f"{prefix}.{part}.{leaf}" if prefix else f"{part}.{leaf}", chunk
            continue
        vocabulary = getattr(module, "org_vocab_size", None)
        if isinstance(vocabulary, int) and tensor.dim() and tensor.shape[0] > vocabulary:
            tensor = tensor[:vocabulary]
        yield name, tensor


def vllm_worker_report(worker: Any, directory: str) -> None:
    """Runs in each vLLM worker (``collective_rpc``): writes this rank's fingerprint to ``directory``."""
    from vllm.distributed import get_tensor_model_parallel_world_size

    model = worker.get_model()
    ranks = get_tensor_model_parallel_world_size()
    if ranks == 1:
        tensors = WeightFingerprint.of(unfused_tensors(model)).tensors
    else:
        tensors = {name: tensor_digest(name, parameter) for name, parameter in model.named_parameters()}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    packed = {fused: list(parts) for fused, parts in (getattr(model, "packed_modules_mapping", None) or {}).items()}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{rank}{FILE_SUFFIX}"), "w") as handle:
        json.dump({"rank": rank, "exact": ranks == 1, "tensors": tensors, "packed": packed}, handle)


def _make_directory(_server: Any) -> str:
    """Runs on a replica's first server actor: a fresh directory on its node for the workers' answers."""
    return tempfile.mkdtemp(prefix="rllm-served-weights-")


def _take_reports(_server: Any, directory: str) -> list[dict[str, Any]]:
    """Runs on each server actor of a replica: the answers its node's workers wrote, then the directory removed."""
    if not os.path.isdir(directory):
        return []
    reports = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(FILE_SUFFIX):
            with open(os.path.join(directory, name)) as handle:
                reports.append(json.load(handle))
    shutil.rmtree(directory, ignore_errors=True)
    return reports


def combine_ranks(reports: list[dict[str, Any]], replica: int) -> ServedWeights:
    """One replica's ``ServedWeights`` from its ranks' reports (one exact report, or several shards' digests)."""
    if not reports:
        raise TrainingGuardError(f"rollout replica {replica} reported no served weights (no worker answered)")
    packed = {fused: tuple(parts) for fused, parts in (reports[0].get("packed") or PACKED_MODULES).items()}
    if len(reports) == 1 and reports[0].get("exact"):
        return ServedWeights(WeightFingerprint(dict(reports[0]["tensors"])), exact=True, packed=packed)
    combined: dict[str, hashlib._Hash] = {}
    for report in sorted(reports, key=lambda r: int(r.get("rank", 0))):
        for name, digest in sorted(report["tensors"].items()):
            combined.setdefault(name, hashlib.sha256()).update(f"{report.get('rank', 0)}:{digest};".encode())
    return ServedWeights(WeightFingerprint({n: h.hexdigest() for n, h in combined.items()}), exact=False,
                         packed=packed)


def vllm_served_weights(replicas: list[list[Any]]) -> list[ServedWeights]:
    """Each vLLM replica's served weights; ``replicas`` holds each replica's server actors, first one leading."""
    found = []
    for index, servers in enumerate(replicas):
        directory = ray.get(call_on_actor(servers[0], _make_directory))
        ray.get(vllm_collective_rpc(servers[0], vllm_worker_report, directory))
        reports = [report for server in servers for report in ray.get(call_on_actor(server, _take_reports, directory))]
        found.append(combine_ranks(reports, index))
    return found


# -------------------------------------------------------------------------------------------- SGLang
def sglang_checksums(body: Mapping[str, Any], replica: int) -> ServedWeights:
    """One replica's ``ServedWeights`` from SGLang's ``/weights_checker`` checksum answer (compared for change)."""
    if not body.get("success") or not body.get("ranks"):
        raise TrainingGuardError(f"rollout replica {replica}: SGLang's weights checker did not answer with "
                                 f"checksums ({body.get('message', 'no message')})")
    reports = [{"rank": (rank.get("parallelism_info") or {}).get("rank", position), "tensors": rank["checksums"]}
               for position, rank in enumerate(body["ranks"])]
    return combine_ranks(reports, replica)


def sglang_served_weights(addresses: list[str], timeout: float = 600.0) -> list[ServedWeights]:
    """Each SGLang replica's tensor checksums, asked of its HTTP server (``host:port``, verl's ``server_address``)."""
    found = []
    with open_sync_client(timeout=timeout) as client:
        for index, address in enumerate(addresses):
            response = client.post(f"http://{address}/weights_checker", json={"action": "checksum"})
            try:
                body = response.json()
            except ValueError:
                body = {"success": False, "message": f"HTTP {response.status_code}: {response.text[:200]}"}
            found.append(sglang_checksums(body, index))
    return found
