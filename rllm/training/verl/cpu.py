"""verl on CPU: the platform, process group and recipe overlay that let verl's own trainer run without a GPU.

For tests and laptops: ``RLLM_VERL_CPU=1`` (set by the launcher's ``--cpu``, never chosen silently)
makes the plugin (``rllm.training.verl.plugin``, imported by ``import verl`` in every process)
register this platform, and the launcher merges the recipe overlay ``config/overlay/cpu.yaml``
(``CPU_OVERLAY``) into the recipe. The pinned verl ships no CPU platform; what it takes:

* a ``PlatformBase`` named ``cpu`` (verl's own registry; ``VERL_PLATFORM=cpu`` selects it) whose
  Ray resource is ``GPU``, so verl's resource pools (which always ask for GPUs) get one *logical*
  GPU per worker (``ray_init.num_gpus``);
* ``VERL_ENGINE_DEVICE=cuda``, verl's own switch that picks the FSDP engine (registered for
  cuda/npu only), which then runs on this platform's device, ``cpu``;
* a gloo-only process group: verl builds ``cpu:gloo,<device>:<backend>``, which with device
  ``cpu`` is ``cpu:gloo,cpu:gloo`` and torch refuses a device twice. verl has no hook for the
  backend, so ``rllm.training.verl.verl_internals.use_gloo_process_group`` wraps the one function
  the FSDP worker calls (``tests/rllm/training/verl/test_verl_internals.py`` pins it);
* TransferQueue sized for a small machine (one storage unit; its default of 8 asks Ray for 8 CPUs
  and waits forever on 2 cores), ``sdpa`` attention (flash-attn is GPU only) and FSDP2 (FSDP1
  refuses CPU parameters).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rllm.errors import ConfigurationError

logger = logging.getLogger(__name__)

CPU_SWITCH = "RLLM_VERL_CPU"
"""Environment variable that turns the CPU mode on (``1``); the launcher's ``--cpu`` sets it."""

CPU_ENV = {CPU_SWITCH: "1", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}
"""What every process of a CPU run needs in its environment (Ray workers inherit the driver's)."""


RAY_NO_PRESTART = {"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
"""Ray starts no idle workers ahead of need: in a CPU run of the lookup recipe three of them sat idle all run, each
a Python process importing Ray (about 2.2 CPU-seconds apiece on the 2-core machine, docs/benchmarks.md)."""


def cpu_environment() -> dict[str, str]:
    """``CPU_ENV``, ``RAY_NO_PRESTART`` and ``OMP_NUM_THREADS`` (this machine's cores); the caller's own values win.

    Ray starts every actor that names no CPUs (verl's FSDP workers, the rollout server) with
    ``OMP_NUM_THREADS=1`` unless the driver's environment sets it, which leaves torch one thread
    per process: on a 2-core machine half of it, for the actor's update and the rollouts alike
    (they never run at once in verl's synchronous trainer).
    """
    return {**CPU_ENV, **{name: os.environ.get(name) or value for name, value in RAY_NO_PRESTART.items()},
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)}

CPU_OVERLAY = "cpu"
"""``--cpu``'s Hydra overlay, ``config/overlay/cpu.yaml``: what fits a recipe to one CPU process (one logical GPU,
one storage unit, sdpa, FSDP2, the embedded rollout backend in fp32; fp16 does not work on CPU: see
``check_precision``), and four settings that cost a 2-core machine most of a step; the file says why each."""
CPU_OVERRIDES = [f"+overlay={CPU_OVERLAY}"]
"""The Hydra override that selects the CPU overlay, for composing a recipe as ``--cpu`` does (``hydra.compose``)."""


def cpu_mode() -> bool:
    """Whether this process runs verl's CPU mode (``RLLM_VERL_CPU=1``)."""
    return os.environ.get(CPU_SWITCH, "").strip().lower() in {"1", "true", "yes"}


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _CPUDevice:
    """What the pinned verl calls on ``get_torch_device()`` (its ``torch.cuda``), answered for the CPU; nothing else.

    ``torch.cpu``'s own functions where it has them (streams, events, synchronize, device count);
    memory statistics are 0 and cache control does nothing (the host has no device allocator); the
    RNG state is torch's. Any other name raises ``AttributeError`` naming it, so a verl call this
    platform does not know fails where it is made instead of doing nothing.
    """

    is_available = staticmethod(torch.cpu.is_available)
    synchronize = staticmethod(torch.cpu.synchronize)
    current_stream = staticmethod(torch.cpu.current_stream)
    stream = staticmethod(torch.cpu.stream)
    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    device_count = staticmethod(torch.cpu.device_count)
    current_device = staticmethod(torch.cpu.current_device)
    set_device = staticmethod(_nothing)
    empty_cache = staticmethod(_nothing)
    ipc_collect = staticmethod(_nothing)
    set_per_process_memory_fraction = staticmethod(_nothing)
    reset_peak_memory_stats = staticmethod(_nothing)
    memory_allocated = staticmethod(_zero)
    memory_reserved = staticmethod(_zero)
    max_memory_allocated = staticmethod(_zero)
    max_memory_reserved = staticmethod(_zero)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)

    @staticmethod
    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def get_device_name(*args: Any, **kwargs: Any) -> str:
        return "cpu"

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the CPU platform's device module has no {name!r}: verl called a device function "
                             "rllm's CPU mode does not know (rllm.training.verl.cpu._CPUDevice lists those it does)")


def register_cpu_platform() -> None:
    """Register the ``cpu`` platform in verl's ``PlatformRegistry`` (selected by ``VERL_PLATFORM=cpu``)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """A CPU as verl's accelerator: logical Ray GPUs, gloo, no IPC."""

        _device_module = _CPUDevice()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return self._device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return cpu_mode()

        def current_device(self) -> Any:
            # verl passes get_device_id() as a tensor's device: an index would mean an accelerator.
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # logical GPUs (ray_init.num_gpus): verl's resource pools always ask for them

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


def activate() -> None:
    """Everything a process of a CPU run needs from the plugin: the platform and the gloo process group."""
    from rllm.training.verl.verl_internals import use_gloo_process_group

    register_cpu_platform()
    use_gloo_process_group()
    logger.debug("verl CPU mode: platform 'cpu' registered, gloo-only process group")


_FP16 = {"fp16", "float16", "half"}


def check_precision(config: Any) -> None:
    """Refuse fp16 in a CPU run, naming the keys: its entropy metric overflows to inf and nothing skips a NaN step.

    Under CPU autocast (unlike CUDA's) softmax, log_softmax and sum run in the input's dtype, so verl's
    per-token log-probs and entropies stay fp16, and the trainer's token-mean of the entropies sums
    them in fp16: past 65504 (about 7,300 tokens at the entropy of a random 8k-vocabulary model) it is
    inf. verl's ``ShardedGradScaler`` defaults to ``device="cuda"`` and turns itself off without CUDA,
    so there is no loss scaling and no skipping of inf/NaN gradients. bf16 has fp32's range: it
    trains on CPU (its log-probs are coarser). Raises ``ConfigurationError`` when the actor's
    mixed-precision ``param_dtype`` or the rollout's ``dtype`` is fp16.
    """
    from omegaconf import OmegaConf

    keys = ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", "actor_rollout_ref.rollout.dtype")
    fp16 = {key: value for key in keys if str(value := OmegaConf.select(config, key, default="")).lower() in _FP16}
    if fp16:
        settings = ", ".join(f"{k}={v}" for k, v in fp16.items())
        raise ConfigurationError(f"{settings}: fp16 half precision does not train on CPU: CPU autocast, unlike CUDA's, "
                                 "leaves softmax and sum in fp16, so verl's per-token entropies stay fp16 and their "
                                 "sum over a step overflows to inf, and verl's ShardedGradScaler turns itself off "
                                 "without CUDA (no loss scaling, no skipping of inf/NaN gradients); run fp16 on a GPU, "
                                 "or set these to fp32 / float32 or bf16 / bfloat16 for a CPU run")
