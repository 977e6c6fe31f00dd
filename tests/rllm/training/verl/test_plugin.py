"""What ``import verl`` loads from rllm: the plugin entry point, the embedded backend in verl's registries, and an
installed environment in which verl's actor initialises.

verl exposes rollout backends through a public registry (``RolloutReplicaRegistry``) and, inside each
FSDP worker, a private dict (``verl.workers.rollout.base._ROLLOUT_REGISTRY``) with no register
function. The plugin fills both; these tests fail when verl changes either, so a verl upgrade cannot
drop the backend silently.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest


def test_the_plugin_is_a_verl_entry_point_of_the_installed_package() -> None:
    entry = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="verl.plugins")}
    assert entry.get("rllm") == "rllm.training.verl.plugin"


def test_import_verl_registers_the_embedded_backend_in_a_fresh_process() -> None:
    code = ("import verl\n"
            "from verl.workers.rollout.base import get_rollout_class\n"
            "from verl.workers.rollout.replica import get_rollout_replica_class\n"
            "print(get_rollout_class('rllm_embedded').__qualname__, get_rollout_replica_class('rllm_embedded').__qualname__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"OTEL_SDK_DISABLED": "true", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["EmbeddedServerAdapter", "EmbeddedReplica"]


def test_verls_private_rollout_registry_still_has_the_shape_the_plugin_fills() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert isinstance(base._ROLLOUT_REGISTRY, dict)
    assert ("vllm", "async") in base._ROLLOUT_REGISTRY  # keys: (rollout.name, mode) -> "module.Class"
    assert isinstance(base._ROLLOUT_REGISTRY[("vllm", "async")], str)
    assert callable(RolloutReplicaRegistry.register) and "vllm" in RolloutReplicaRegistry._registry
    assert base._ROLLOUT_REGISTRY[("rllm_embedded", "async")] == "rllm.training.verl.embedded.adapter.EmbeddedServerAdapter"


def test_verls_model_patching_runs_for_a_qwen3_in_this_environment() -> None:
    """verl's FSDP actor patches the model at init; with trl >= 1.13 installed that raised ImportError."""
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.import_utils import is_trl_available

    from rllm.offline.tiny_models import build_tiny_qwen3, build_tiny_tokenizer

    model = build_tiny_qwen3(build_tiny_tokenizer())
    apply_monkey_patch(model, use_remove_padding=True)
    if is_trl_available():  # the documented installs bring trl (the rag extra): the value-head model must import
        try:
            from trl.experimental.ppo import AutoModelForCausalLMWithValueHead
        except ImportError:  # pragma: no cover - older trl layout
            from trl import AutoModelForCausalLMWithValueHead
        assert AutoModelForCausalLMWithValueHead.state_dict is not None


@pytest.mark.parametrize("extras", ["train,rag", "dev"])
def test_the_documented_extras_pin_a_trl_that_verl_accepts(extras: str) -> None:
    """trl 1.13 removed the class verl 0.9.1 imports whenever trl is importable; every extra bringing trl pins below it."""
    from packaging.requirements import Requirement

    requirements = [Requirement(r) for r in importlib.metadata.requires("rllm") or []]
    trl = [r for r in requirements if r.name == "trl"]
    assert trl, "no extra declares trl any more: drop this test"
    for requirement in trl:
        assert not requirement.specifier.contains("1.13.0") and requirement.specifier.contains("1.12.0"), requirement
