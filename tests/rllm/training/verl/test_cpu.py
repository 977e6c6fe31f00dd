"""verl's CPU mode (``rllm.training.verl.cpu``)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import hydra
import pytest
import torch

# --- fp16 on CPU: why the CPU mode refuses it and accepts bf16 (check_precision) ------------------------------
#
# verl's FSDP engine runs the model and its entropy / log-prob functions under
# torch.autocast(device_type=<device>, dtype=mixed_precision.param_dtype) (FSDPEngineWithLMHead.forward_step);
# the trainer then averages the per-token entropies into ``actor/entropy`` with agg_loss, outside autocast
# (trainer/ppo/v1/trainer_base.py). On CPU the entropies are fp16, so that average is summed in fp16 and overflows.

_ROLLOUT_TOKENS = 1024
_ROLLOUTS = 8
"""A step of 8 rollouts of 1,024 response tokens (8,192; the fp16 CPU run that showed inf had 7,391), all eight
the same sampled tokens, as a group of identical rollouts can be: one forward pass gives every rollout's values."""


@pytest.fixture(scope="module")
def actor_outputs() -> Any:
    """``actor_outputs(dtype)``: a step's entropies, log-probs and ``actor/entropy`` as verl computes them on CPU.

    Per token as verl's FSDP engine does with ``mixed_precision.param_dtype=dtype``, and ``actor/entropy`` as the
    trainer logs it from them. The model is a random tiny Qwen3 (fp32 weights, like verl's master copy) on
    Qwen's tokenizer (its first 8,192 ranks).
    """
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    from rllm.offline.chat_templates import load_chat_template
    from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer
    from rllm.offline.tiny_models import build_tiny_qwen3

    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)
    model = build_tiny_qwen3(tokenizer)
    ids = torch.randint(len(tokenizer), (1, _ROLLOUT_TOKENS), generator=torch.Generator().manual_seed(0))
    cache: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def outputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, float]:
        if dtype not in cache:
            autocast = nullcontext() if dtype == torch.float32 else torch.autocast("cpu", dtype=dtype)
            with torch.no_grad(), autocast:
                logits = model(input_ids=ids, use_cache=False).logits
                entropy = entropy_from_logits(logits).expand(_ROLLOUTS, -1)
                logprobs = logprobs_from_logits(logits[0, :-1], ids[0, 1:])
            # As the trainer logs actor/entropy: agg_loss with the actor's loss_agg_mode over the response mask.
            metric = agg_loss(loss_mat=entropy, loss_mask=torch.ones_like(entropy, dtype=torch.int64),
                              loss_agg_mode="token-mean", loss_scale_factor=None)
            cache[dtype] = entropy, logprobs, metric.item()
        return cache[dtype]

    outputs.vocab_size = model.config.vocab_size  # type: ignore[attr-defined]
    return outputs


def test_fp16_on_cpu_sums_finite_token_entropies_to_an_infinite_actor_entropy(actor_outputs) -> None:
    entropy, _, metric = actor_outputs(torch.float16)
    assert entropy.dtype == torch.float16 and bool(entropy.isfinite().all())  # every token's entropy is fine...
    assert entropy.float().sum().item() > torch.finfo(torch.float16).max  # ...their sum is past fp16's 65504
    assert math.isinf(metric)  # so actor/entropy is inf: the sum overflows, not the model
    _, _, fp32_metric = actor_outputs(torch.float32)
    assert fp32_metric == pytest.approx(math.log(actor_outputs.vocab_size), abs=0.05)  # a random model: ~uniform


def test_bf16_on_cpu_has_the_range_but_coarser_log_probs(actor_outputs) -> None:
    entropy, logprobs, metric = actor_outputs(torch.bfloat16)
    assert entropy.dtype == logprobs.dtype == torch.bfloat16
    assert metric == pytest.approx(math.log(actor_outputs.vocab_size), abs=0.1)
    gap = (logprobs.float() - actor_outputs(torch.float32)[1]).abs().mean().item()
    assert 1e-3 < gap < 0.1  # rounded to bf16: above a 1e-3 gap bar, inside the guard's default max_logprob_gap


def test_cpu_autocast_leaves_softmax_and_sum_in_half_precision_where_cuda_autocast_does_not() -> None:
    logits = torch.randn(3, 8, dtype=torch.float16)
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.softmax(logits, -1).dtype == torch.float16
        assert torch.log_softmax(logits, -1).dtype == torch.float16
        assert logits.sum().dtype == torch.float16
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ("aten::softmax.int", "aten::log_softmax.int", "aten::sum"):
        assert has_kernel(op, "AutocastCUDA") and not has_kernel(op, "AutocastCPU"), op  # CUDA runs these in fp32


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the scaler is on")
def test_verls_grad_scaler_is_off_on_cpu_and_steps_into_a_nan_gradient() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = ShardedGradScaler(growth_interval=400)  # as verl's FSDP engine builds it for param_dtype fp16
    assert not scaler.is_enabled()  # device defaults to "cuda": without CUDA it turns itself off
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    weight.grad = torch.tensor([math.nan, 1.0])
    scaler.unscale_(optimizer)
    scaler.step(optimizer)  # an enabled scaler would skip this step
    assert math.isnan(weight[0].item())


def test_the_cpu_launch_refuses_fp16_with_its_reason_and_accepts_bf16(monkeypatch, tmp_path) -> None:
    from fixtures.hotpotqa_rows import write_hotpotqa_rows

    from rllm.errors import ConfigurationError
    from rllm.training.verl.cpu import CPU_OVERRIDES
    from rllm.training.verl.train import CONFIG_DIR, CONFIG_NAME, check_launch, prepare_config

    monkeypatch.setenv("HOTPOTQA_DIR", str(write_hotpotqa_rows(tmp_path)))  # the launch tries the first row

    def launch(*overrides: str) -> None:
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            check_launch(prepare_config(hydra.compose(config_name=CONFIG_NAME, overrides=[*CPU_OVERRIDES, *overrides])))

    monkeypatch.setenv("RLLM_VERL_CPU", "1")
    for fp16 in ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
                 "actor_rollout_ref.rollout.dtype=float16"):
        key = fp16.split("=")[0]
        with pytest.raises(ConfigurationError, match=rf"^{key}=(fp16|float16): fp16 half precision does not train "
                                                     r"on CPU: CPU autocast, unlike CUDA's, leaves softmax and sum in "
                                                     r"fp16, .* overflows to inf, and verl's ShardedGradScaler turns "
                                                     r"itself off without CUDA"):
            launch(fp16)
    launch("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
           "actor_rollout_ref.rollout.dtype=bfloat16")


# --- end of fp16 on CPU ----------------------------------------------------------------------------------------


def test_the_cpu_environment_starts_no_idle_ray_workers_unless_the_caller_asks(monkeypatch) -> None:
    from rllm.training.verl.cpu import cpu_environment

    for name in ("RAY_prestart_worker_first_driver", "RAY_enable_worker_prestart"):
        monkeypatch.delenv(name, raising=False)
    env = cpu_environment()
    assert env["RAY_prestart_worker_first_driver"] == env["RAY_enable_worker_prestart"] == "0"
    monkeypatch.setenv("RAY_enable_worker_prestart", "1")
    assert cpu_environment()["RAY_enable_worker_prestart"] == "1"
