"""The served-weights check for vLLM and SGLang: fused tensors mapped back, exact and change-only comparisons.

Neither engine installs here (no GPU), so nothing here runs vLLM or SGLang. Stand-ins written for these
tests take their place: a module tree shaped like vLLM's single-rank Qwen3 (vLLM 0.24's names,
``packed_modules_mapping``, ``output_sizes`` of ``QKVParallelLinear`` / ``MergedColumnParallelLinear``,
``org_vocab_size`` of a padded ``VocabParallelEmbedding``, a tied ``lm_head`` not listed) built from
a real ``transformers`` Qwen3 model, and SGLang's ``/weights_checker`` answer as sglang 0.5.12's
``weight_checker.py`` and ``http_server.py`` write it. The embedded backend's check runs for real in
``test_train_cpu.py`` and ``test_guard_faults_rollout.py``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed: the served-weights check needs the train extra")

from rllm.errors import TrainingGuardError  # noqa: E402
from rllm.training.verl.weights import engine_weights  # noqa: E402
from rllm.training.verl.weights.engine_weights import (  # noqa: E402
    ServedWeights,
    combine_ranks,
    sglang_checksums,
    sglang_served_weights,
    unfused_tensors,
)
from rllm.training.verl.weights.fingerprint import WeightFingerprint  # noqa: E402
from rllm.training.verl.weights.served_weights import ServedWeightsCheck  # noqa: E402

DTYPE = torch.bfloat16
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _qwen3(seed: int = 0) -> torch.nn.Module:
    """A real (tiny, random) ``transformers`` Qwen3 with tied embeddings, the actor's architecture."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config).to(DTYPE)


def _actor(model: torch.nn.Module) -> WeightFingerprint:
    """What the FSDP actor reports: its state dict (tied lm_head included), in the serving dtype."""
    return WeightFingerprint.of(model.state_dict().items(), DTYPE)


def _tree(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    root = torch.nn.Module()
    for name, tensor in tensors.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(tensor.clone(), requires_grad=False))
    return root


def _fused(model: torch.nn.Module, pad_rows: int = 32) -> dict[str, torch.Tensor]:
    """The actor's tensors as vLLM / SGLang hold them: q/k/v and gate/up fused, no tied lm_head."""
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    layers = sorted({name.rsplit(".self_attn.", 1)[0] for name in state if ".self_attn." in name})
    for layer in layers:
        for fused, parts, where in (("qkv_proj", ("q_proj", "k_proj", "v_proj"), "self_attn"),
                                    ("gate_up_proj", ("gate_proj", "up_proj"), "mlp")):
            state[f"{layer}.{where}.{fused}.weight"] = torch.cat(
                [state.pop(f"{layer}.{where}.{part}.weight") for part in parts])
    embedding = state["model.embed_tokens.weight"]
    state["model.embed_tokens.weight"] = torch.cat([embedding, torch.zeros(pad_rows, embedding.shape[1],
                                                                            dtype=embedding.dtype)])
    return state


def _vllm_like(model: torch.nn.Module) -> torch.nn.Module:
    """A module tree with vLLM 0.24's single-rank Qwen3 names and the attributes the reader uses."""
    tree = _tree(_fused(model))
    tree.packed_modules_mapping = PACKED  # type: ignore[assignment]
    config = model.config
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    for name, module in tree.named_modules():
        if name.endswith("qkv_proj"):
            module.output_sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        elif name.endswith("gate_up_proj"):
            module.output_sizes = [config.intermediate_size] * 2
        elif name.endswith("embed_tokens"):
            module.org_vocab_size = config.vocab_size
    return tree


def _served(model: torch.nn.Module) -> ServedWeights:
    return ServedWeights(WeightFingerprint.of(unfused_tensors(_vllm_like(model))), exact=True)


def _trained(model: torch.nn.Module, only: str | None = None) -> torch.nn.Module:
    """``model`` after an update: every parameter (or only ``only``) moved by more than a bf16 step."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if only is None or name == only:
                parameter.add_(0.25)
    return model


def _sglang_like(model: torch.nn.Module, ranks: int = 1) -> ServedWeights:
    """SGLang's checksums of its fused tensors (its own hash: here sha256's first 8 bytes, as its CPU path)."""
    answer: dict[str, Any] = {"success": True, "message": "Success.", "ranks": []}
    for rank in range(ranks):
        checksums = {}
        for name, tensor in _fused(model).items():
            shard = tensor.chunk(ranks)[rank].contiguous()
            checksums[name] = hashlib.sha256(shard.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
        answer["ranks"].append({"checksums": checksums, "parallelism_info": {"rank": rank, "tp_rank": rank}})
    return sglang_checksums(answer, 0)


def test_vllms_fused_tensors_split_back_are_the_actors_tensor_for_tensor() -> None:
    model = _qwen3()
    served = _served(model)
    names = set(served.fingerprint.tensors)
    assert "model.layers.0.self_attn.k_proj.weight" in names and "model.layers.1.mlp.up_proj.weight" in names
    assert not any("qkv_proj" in name or "gate_up_proj" in name for name in names)
    assert ServedWeightsCheck().check(0, _actor(model), [served])["rllm/weights/exact"] == 1.0
    check = ServedWeightsCheck()
    check.check(0, _actor(model), [served])
    _trained(model)
    metrics = check.check(1, _actor(model), [_served(model)])
    assert metrics["rllm/weights/changed"] == 1.0


@pytest.mark.parametrize("fault, named", [
    ("stale", "differs from the actor's"),
    ("permuted key rows", "model.layers.0.self_attn.k_proj.weight differs from the actor's"),
    ("padding kept", "model.embed_tokens.weight differs"),
])
def test_what_vllm_serves_wrongly_stops_the_step_naming_the_tensor(fault: str, named: str) -> None:
    model = _qwen3()
    stale = _served(model)
    vllm = _vllm_like(model)
    if fault == "stale":
        _trained(model)
        served = stale
    elif fault == "permuted key rows":
        qkv = vllm.get_submodule("model.layers.0.self_attn.qkv_proj")
        q_rows, k_rows = qkv.output_sizes[0], qkv.output_sizes[1]
        with torch.no_grad():
            rows = qkv.weight[q_rows:q_rows + k_rows].clone()
            qkv.weight[q_rows:q_rows + k_rows] = rows.flip(0)
        served = ServedWeights(WeightFingerprint.of(unfused_tensors(vllm)))
    else:
        del vllm.model.embed_tokens.org_vocab_size
        served = ServedWeights(WeightFingerprint.of(unfused_tensors(vllm)))
    with pytest.raises(TrainingGuardError, match=f"step 2: after the weight sync, rollout server 0 .*{named}"):
        ServedWeightsCheck().check(2, _actor(model), [served])


def test_a_vllm_worker_writes_its_report_and_the_replica_reads_it_back(tmp_path, monkeypatch) -> None:
    ranks = {"n": 1}
    distributed = types.ModuleType("vllm.distributed")
    distributed.get_tensor_model_parallel_world_size = lambda: ranks["n"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.distributed", distributed)
    model = _qwen3()
    worker = types.SimpleNamespace(get_model=lambda: _vllm_like(model))  # vLLM's Worker.get_model
    directory = str(tmp_path / "answers")
    engine_weights.vllm_worker_report(worker, directory)
    reports = engine_weights._take_reports(None, directory)
    assert not (tmp_path / "answers").exists()
    served = combine_ranks(reports, 0)
    assert served.exact and served.packed["qkv_proj"] == ("q_proj", "k_proj", "v_proj")
    assert not served.fingerprint.differences(_actor(model))
    ranks["n"] = 2  # several tensor-parallel ranks: vLLM's own names, compared for change only
    engine_weights.vllm_worker_report(worker, directory)
    sharded = combine_ranks(engine_weights._take_reports(None, directory), 0)
    assert not sharded.exact and "model.layers.0.self_attn.qkv_proj.weight" in sharded.fingerprint.tensors
    with pytest.raises(TrainingGuardError, match="replica 3 reported no served weights"):
        combine_ranks([], 3)


def test_engine_named_checksums_must_change_exactly_when_the_actors_parameters_change() -> None:
    model = _qwen3()
    check = ServedWeightsCheck()
    metrics = check.check(0, _actor(model), [_sglang_like(model, ranks=2)])
    assert metrics["rllm/weights/exact"] == 0.0
    _trained(model)
    assert check.check(1, _actor(model), [_sglang_like(model, ranks=2)])["rllm/weights/changed"] == 1.0
    before = _sglang_like(model, ranks=2)
    _trained(model)  # the update that never reaches the server: it serves what it served
    with pytest.raises(TrainingGuardError, match=r"step 2: .*is the one it served before the sync although the "
                                                 r"actor's .* changed \(the update did not arrive\)"):
        check.check(2, _actor(model), [before])


def test_one_tensor_left_behind_is_named_and_a_change_the_actor_did_not_make_is_caught() -> None:
    model = _qwen3()
    check = ServedWeightsCheck()
    check.check(0, _actor(model), [_sglang_like(model)])
    name = "model.layers.1.post_attention_layernorm.weight"
    before = model.get_parameter(name).detach().clone()
    _trained(model)
    left = copy.deepcopy(model)
    with torch.no_grad():
        left.get_parameter(name).copy_(before)  # every tensor arrived but this one
    with pytest.raises(TrainingGuardError, match=f"step 1: .*{name} is the one it served before the sync although "
                                                 f"the actor's {name} changed"):
        check.check(1, _actor(model), [_sglang_like(left)])
    check = ServedWeightsCheck()
    check.check(0, _actor(model), [_sglang_like(model)])
    moved = _trained(copy.deepcopy(model), only="model.norm.weight")  # the actor did not train: nothing may move
    with pytest.raises(TrainingGuardError, match="step 1: .*model.norm.weight changed although the actor's "
                                                 "model.norm.weight did not"):
        check.check(1, _actor(model), [_sglang_like(moved)])


def test_a_served_tensor_rllm_cannot_map_to_the_actor_stops_instead_of_passing_unchecked() -> None:
    model = _qwen3()
    odd = ServedWeights(WeightFingerprint({"model.layers.0.mlp.experts.w13_weight": "0" * 16}), exact=False)
    with pytest.raises(TrainingGuardError, match="cannot tell which actor parameters its tensor model.layers.0.mlp."
                                                 "experts.w13_weight is made of.*served_weights=false"):
        ServedWeightsCheck().check(0, _actor(model), [odd])


class _SGLangWeightsChecker(BaseHTTPRequestHandler):
    """Answers ``POST /weights_checker`` as sglang 0.5.12's http_server does (ranks of ``ChecksumInfo``)."""

    answer: dict[str, Any] = {}
    requests: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        payload = json.dumps(self.answer).encode()
        self.send_response(200 if self.answer.get("success") else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sglang_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _SGLangWeightsChecker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_sglangs_checksums_are_asked_of_its_weights_checker(sglang_server: str) -> None:
    _SGLangWeightsChecker.requests = []
    _SGLangWeightsChecker.answer = {"success": True, "message": "Success.", "ranks": [
        {"checksums": {"model.norm.weight": "00ff"}, "parallelism_info": {"rank": 1}},
        {"checksums": {"model.norm.weight": "0a0b"}, "parallelism_info": {"rank": 0}}]}
    served = sglang_served_weights([sglang_server])
    assert _SGLangWeightsChecker.requests == [("/weights_checker", {"action": "checksum"})]
    assert not served[0].exact and list(served[0].fingerprint.tensors) == ["model.norm.weight"]
    _SGLangWeightsChecker.answer = {"success": False, "message": "Unsupported action='checksum'"}
    with pytest.raises(TrainingGuardError, match="replica 0: SGLang's weights checker did not answer with checksums "
                                                 r"\(Unsupported action='checksum'\)"):
        sglang_served_weights([sglang_server])


def test_a_vllm_replica_is_read_through_its_server_actors_collective_rpc() -> None:
    """Through Ray: rllm's function sent by ``collective_rpc``, its answer read back by ``__ray_call__``.

    The function is called as vLLM calls it (``method(worker, *args)``); the server actor is a stand-in
    with verl's ``vLLMHttpServer.collective_rpc`` signature (pinned in ``test_verl_internals.py``).
    """
    from pathlib import Path

    from fixtures.ray_script import run_with_ray

    run = run_with_ray(
        "import sys, types, torch\n"
        "from rllm.training.verl.weights.engine_weights import vllm_served_weights\n"
        "@ray.remote\n"
        "class Server:\n"
        "    def __init__(self):\n"
        "        distributed = types.ModuleType('vllm.distributed')\n"
        "        distributed.get_tensor_model_parallel_world_size = lambda: 1\n"
        "        sys.modules['vllm'], sys.modules['vllm.distributed'] = types.ModuleType('vllm'), distributed\n"
        "        model = torch.nn.Module()\n"
        "        model.packed_modules_mapping = {'gate_up_proj': ['gate_proj', 'up_proj']}\n"
        "        model.gate_up_proj = torch.nn.Linear(2, 6, bias=False)\n"
        "        model.gate_up_proj.output_sizes = [3, 3]\n"
        "        self.worker = types.SimpleNamespace(get_model=lambda: model)\n"
        "    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):\n"
        "        method(self.worker, *args, **(kwargs or {}))\n"
        "served = vllm_served_weights([[Server.remote()]])\n"
        "print(served[0].exact, sorted(served[0].fingerprint.tensors))\n",
        cwd=Path(__file__).resolve().parents[4])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "True ['gate_proj.weight', 'up_proj.weight']"
