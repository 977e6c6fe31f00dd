"""The embedded rollout backend's server, driven as verl drives it (no Ray): generation, aborts, weight sync, memory.

A tiny Qwen3 on Qwen's tokenizer (its first 8,192 ranks) with Qwen3's shipped template, saved to a
directory as a user's model is; the server is built from the recipe's own rollout and model config.
The end-to-end run through verl's trainer is ``test_train_cpu.py``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import hydra
import pytest
import torch

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.errors import TrainingGuardError, WeightSyncError  # noqa: E402
from rllm.offline.chat_templates import load_chat_template  # noqa: E402
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer  # noqa: E402
from rllm.offline.tiny_models import build_tiny_qwen3  # noqa: E402
from rllm.training.verl.embedded.server import EmbeddedRolloutServer  # noqa: E402
from rllm.training.verl.train import CONFIG_DIR, CONFIG_NAME, prepare_config  # noqa: E402
from rllm.training.verl.weights.fingerprint import WeightFingerprint  # noqa: E402

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("policy")
    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)
    build_tiny_qwen3(tokenizer, out_dir=out)
    return out


def _server(model_dir: Path, *overrides: str) -> EmbeddedRolloutServer:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = prepare_config(hydra.compose(config_name=CONFIG_NAME, overrides=[
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.rollout.max_model_len=512", *overrides]))
    return EmbeddedRolloutServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, 0, device="cpu")


def _prompt(server: EmbeddedRolloutServer) -> list[int]:
    return server.engine.renderer.encode("<|im_start|>user\nWho directed Krull?<|im_end|>\n<|im_start|>assistant\n")


def _actor_tensors(server: EmbeddedRolloutServer, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """What the FSDP actor would stream: every parameter by its Hugging Face name (here: the served ones, scaled)."""
    state = server.engine.model.state_dict()
    return {name: state[name].detach().clone() * scale for name in server._parameter_names}


def test_generate_samples_with_one_logprob_per_token_and_says_which_weights(model_dir: Path) -> None:
    server = _server(model_dir)
    output = asyncio.run(server.generate("r1", _prompt(server), {**SAMPLING, "max_tokens": 12}))
    assert output.stop_reason == "completed" and 0 < len(output.token_ids) <= 12
    assert len(output.log_probs) == len(output.token_ids) and all(lp <= 0 for lp in output.log_probs)
    assert output.extra_fields == {"global_steps": None}  # no sync yet
    no_logprobs = asyncio.run(server.generate("r2", _prompt(server), {**SAMPLING, "logprobs": False, "max_tokens": 4}))
    assert no_logprobs.log_probs is None


def test_a_sync_loads_the_actors_weights_and_the_server_fingerprints_what_it_serves(model_dir: Path) -> None:
    server = _server(model_dir)
    sent = _actor_tensors(server, scale=1.01)
    expected = WeightFingerprint.of(sent.items())
    asyncio.run(server.begin_weight_update())
    names = list(sent)
    asyncio.run(server.load_weights({n: sent[n] for n in names[: len(names) // 2]}))  # in buckets
    asyncio.run(server.load_weights({n: sent[n] for n in names[len(names) // 2:]}))
    report = asyncio.run(server.finish_weight_update(4, expected.digest))
    assert report["global_steps"] == 4 and report["tensors"] == len(names) and report["fingerprint"] == expected.digest
    served = WeightFingerprint(asyncio.run(server.weights_fingerprint()))
    assert served.differences(expected) == [] and set(served.tensors) <= set(expected.tensors)
    output = asyncio.run(server.generate("r", _prompt(server), {**SAMPLING, "max_tokens": 2}))
    assert output.extra_fields["global_steps"] == 4


def test_stale_or_partial_weights_stop_the_sync(model_dir: Path) -> None:
    server = _server(model_dir)
    sent = _actor_tensors(server, scale=1.01)
    first = next(iter(sent))
    asyncio.run(server.begin_weight_update())
    asyncio.run(server.load_weights({n: t for n, t in sent.items() if n != first}))
    with pytest.raises(WeightSyncError, match="left 1 parameters of the served model unchanged"):
        asyncio.run(server.finish_weight_update(1, "whatever"))
    # Everything arrived, but not what the adapter says it sent (changed in transit): refused.
    asyncio.run(server.begin_weight_update())
    asyncio.run(server.load_weights(sent))
    other = WeightFingerprint.of(_actor_tensors(server, scale=1 / 1.01).items())
    with pytest.raises(WeightSyncError, match="weights of step 2 arrived at the rollout server changed"):
        asyncio.run(server.finish_weight_update(2, other.digest))
    with pytest.raises(WeightSyncError, match="does not have"):
        asyncio.run(server.load_weights({"model.no_such.weight": torch.zeros(1)}))


def test_abort_all_requests_frees_the_batch_and_refuses_until_resumed(model_dir: Path) -> None:
    server = _server(model_dir)

    async def scenario() -> tuple[Any, Any, Any]:
        long = asyncio.ensure_future(server.generate("long", _prompt(server), {**SAMPLING, "max_tokens": 400}))
        while server.engine.stats.sampled_tokens < 3:
            await asyncio.sleep(0.01)
        await server.abort_all_requests(reject_request=True)
        aborted = await long
        refused = await server.generate("new", _prompt(server), {**SAMPLING, "max_tokens": 4})
        await server.resume_generation()
        served = await server.generate("again", _prompt(server), {**SAMPLING, "max_tokens": 4})
        return aborted, refused, served

    aborted, refused, served = asyncio.run(scenario())
    assert aborted.stop_reason == "aborted" and 0 < len(aborted.token_ids) < 400
    assert len(aborted.log_probs) == len(aborted.token_ids)
    assert refused.stop_reason == "aborted" and refused.token_ids == []
    assert served.stop_reason == "completed"
    assert asyncio.run(server.num_inflight()) == 0 and server.engine.stats.aborted >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: sleep frees GPU memory only on a GPU")
def test_sleep_frees_and_wake_up_restores_the_weights_device_memory(model_dir: Path) -> None:
    server = EmbeddedRolloutServer.__new__(EmbeddedRolloutServer)
    cpu = _server(model_dir)
    server.__dict__.update(cpu.__dict__)
    server.device = "cuda"
    server.engine.model.to("cuda")
    held = asyncio.run(server.device_memory_bytes())
    asyncio.run(server.sleep())
    assert asyncio.run(server.device_memory_bytes()) < held
    asyncio.run(server.wake_up())
    assert asyncio.run(server.device_memory_bytes()) >= held


def _lora_actor(model_dir: Path) -> Any:
    """A LoRA actor as verl builds it (peft's ``get_peft_model`` over the policy), one update along."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    actor = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules="all-linear"))
    _step(actor, seed=0)
    return actor


def _step(actor: Any, seed: int) -> None:
    """A training step's effect on a LoRA actor: its adapter weights move (lora_B starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in actor.named_parameters():
            if ".lora_" in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


async def _sync(server: EmbeddedRolloutServer, sent: dict[str, torch.Tensor], peft_config: dict, part: str,
                step: int) -> None:
    """What ``EmbeddedServerAdapter.update_weights`` does with one of verl's LoRA syncs."""
    await server.begin_weight_update(peft_config, part)
    await server.load_weights(sent)
    await server.finish_weight_update(step, WeightFingerprint.of(sent.items()).digest)


def _verls_lora_sync(actor: Any, base: bool) -> dict[str, torch.Tensor]:
    """The tensors verl 0.9.1's LoRA sync sends: its own ``collect_lora_params`` (and ``replace_lora_wrapper``)."""
    from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper

    params = collect_lora_params(module=actor, layered_summon=False, base_sync_done=not base)
    if base:
        config = actor.peft_config["default"]
        params = {replace_lora_wrapper(name, config): tensor for name, tensor in params.items()}
    return {name: tensor.detach().clone() for name, tensor in params.items()}


def test_a_lora_sync_serves_base_plus_the_adapter_under_the_actors_own_names(model_dir: Path) -> None:
    pytest.importorskip("verl", reason="the sync's tensors are built by verl's own functions (the train extra)")
    from rllm.training.verl.weights.served_weights import ServedWeights, ServedWeightsCheck

    actor, server = _lora_actor(model_dir), _server(model_dir)
    peft_config = actor.peft_config["default"].to_dict()
    prompt = torch.tensor([_prompt(server)])
    with torch.no_grad():
        base_logits = server.engine.model(prompt).logits
    asyncio.run(_sync(server, _verls_lora_sync(actor, base=True), peft_config, "base", 0))
    asyncio.run(_sync(server, _verls_lora_sync(actor, base=False), peft_config, "adapter", 0))

    served = WeightFingerprint(asyncio.run(server.weights_fingerprint()))
    actor_print = WeightFingerprint.of(actor.state_dict().items())  # what actor_fingerprint computes in the worker
    assert any(".lora_A.default." in name for name in served.tensors)
    assert served.differences(actor_print) == [] and set(served.tensors) <= set(actor_print.tensors)
    with torch.no_grad():
        served_logits, actor_logits = server.engine.model(prompt).logits, actor(prompt).logits
    assert torch.equal(served_logits, actor_logits) and not torch.allclose(served_logits, base_logits)

    check = ServedWeightsCheck()
    check.check(0, actor_print, [ServedWeights(served)])
    stale = _verls_lora_sync(actor, base=False)  # the adapter of step 0, sent again after step 1
    _step(actor, seed=1)
    asyncio.run(_sync(server, stale, peft_config, "adapter", 1))
    with pytest.raises(TrainingGuardError, match=r"step 1: .*\.lora_[AB]\.default\.weight differs from the actor's"):
        check.check(1, WeightFingerprint.of(actor.state_dict().items()),
                    [ServedWeights(WeightFingerprint(asyncio.run(server.weights_fingerprint())))])


def test_a_lora_sync_missing_an_adapter_tensor_or_sending_whole_weights_is_refused(model_dir: Path) -> None:
    pytest.importorskip("verl", reason="the sync's tensors are built by verl's own functions (the train extra)")
    actor, server = _lora_actor(model_dir), _server(model_dir)
    peft_config = actor.peft_config["default"].to_dict()
    adapter = _verls_lora_sync(actor, base=False)
    first = next(iter(adapter))
    asyncio.run(server.begin_weight_update(peft_config, "adapter"))
    asyncio.run(server.load_weights({name: tensor for name, tensor in adapter.items() if name != first}))
    with pytest.raises(WeightSyncError, match="left 1 parameters of the served model unchanged"):
        asyncio.run(server.finish_weight_update(1, "whatever"))
    with pytest.raises(WeightSyncError, match="whole weights to a server that serves base plus a LoRA adapter"):
        asyncio.run(server.begin_weight_update(None, "full"))
