"""The recipe's ``rllm:`` block (``rllm.training.verl.settings``) and the launcher's overlays (``--cpu``, ``--smoke``).

Every key of the block, taken from the settings module's own list (a new key is covered here without a
new line), is fed a value of the wrong type and one out of range: each is refused at launch with a
``ConfigurationError`` naming the key and the value. The shipped recipes parse, an unknown key is
refused, and the docs list every key with its default. The overlays compose exactly what the
override lists they replaced composed.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

import hydra
import pytest
import yaml
from omegaconf import OmegaConf

pytest.importorskip("verl", reason="the recipes extend verl's config: the train extra")

from rllm.errors import ConfigurationError  # noqa: E402
from rllm.training.verl.settings import (  # noqa: E402
    SECTION_KIND,
    SETTINGS,
    AgentLoopBlock,
    GuardSettings,
    RllmSettings,
    Setting,
    read_settings,
)
from rllm.training.verl.train import CONFIG_DIR, flag_overlays, overlay_override, prepare_config  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
RECIPES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in {"agent_loops", "strands_base"})
"""The shipped recipes (``agent_loops.yaml`` is verl's registry, ``strands_base.yaml`` a recipe's body)."""


def _config(key: str, value: Any) -> Any:
    """A config whose ``key`` (dotted, under ``rllm``) holds ``value``, as OmegaConf hands it to the reader."""
    node: Any = value
    for part in reversed(key.split(".")):
        node = {part: node}
    return OmegaConf.create(node)


def _cases(which: str) -> list[Any]:
    return [pytest.param(s.key, value, id=f"{s.key}={value!r}") for s in SETTINGS for value in getattr(s.kind, which)]


@pytest.mark.parametrize(("key", "value"), _cases("wrong_types"))
def test_a_value_of_the_wrong_type_is_refused_naming_the_key_the_value_and_what_it_takes(key: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        read_settings(_config(key, value))
    assert str(caught.value).startswith(f"{key}={value!r}: "), str(caught.value)
    assert "expected " in str(caught.value)


@pytest.mark.parametrize(("key", "value"), _cases("wrong_values"))
def test_a_value_out_of_range_is_refused_naming_the_key_the_value_and_what_it_takes(key: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        read_settings(_config(key, value))
    assert str(caught.value).startswith(f"{key}={value!r}: "), str(caught.value)
    assert "expected " in str(caught.value)


def test_every_key_has_wrong_values_to_test_and_every_non_flag_one_out_of_range() -> None:
    """A key added without its kind's examples would go untested: every kind gives them."""
    for setting in SETTINGS:
        assert setting.kind.wrong_types, setting.key
        flag = setting.kind.expected.startswith("true or false")
        assert setting.kind.wrong_values or flag or setting.kind is SECTION_KIND, setting.key


def test_the_default_of_every_key_is_what_a_recipe_that_leaves_it_out_gets() -> None:
    read = read_settings({"rllm": {"guards": {}, "agent_loop": {}}})
    assert read == RllmSettings(agent_loop=AgentLoopBlock())
    for setting in SETTINGS[1:]:
        value: Any = read
        for part in setting.key.split(".")[1:]:
            value = getattr(value, part)
        if setting.kind is not SECTION_KIND:
            assert value == setting.default, setting.key
    assert read_settings({}) == RllmSettings() and RllmSettings().agent_loop is None  # a recipe without the block
    assert read_settings({"rllm": {"guards": None}}).guards == GuardSettings()


@pytest.mark.parametrize("section", [s.key for s in SETTINGS if s.kind is SECTION_KIND])
def test_an_unknown_key_is_refused_naming_it_and_the_keys_there_are(section: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"unknown keys \['{re.escape(section)}.max_nan_steps'\] "
                                                 rf"\({re.escape(section)}.max_nan_steps=3\): nothing reads them; "
                                                 rf"{re.escape(section)} holds "):
        read_settings(_config(f"{section}.max_nan_steps", 3))


def test_a_typo_is_refused_with_the_key_it_resembles() -> None:
    with pytest.raises(ConfigurationError, match=r"did you mean rllm\.guards\.max_logprob_gap\?"):
        read_settings(_config("rllm.guards.max_logprob_gaps", 0.2))
    with pytest.raises(ConfigurationError, match=r"did you mean rllm\.agent_loop\?"):
        read_settings(_config("rllm.agnet_loop", {}))


def test_values_are_held_as_the_consumers_read_them() -> None:
    read = read_settings({"rllm": {"max_infra_failure_share": 1, "reward_fn": "",
                                   "guards": {"served_weights": None, "max_logprob_gap": 0},
                                   "agent_loop": {"timeout_s": 30, "infra_exceptions": ["httpx:TransportError"],
                                                  "tool_kwargs": None, "own_client": None,
                                                  "budget": {"max_model_turns": 4, "max_tool_calls": None},
                                                  "tool_factory": "/run/dir/workflow.pkl:tools"}}})
    assert read.max_infra_failure_share == 1.0 and isinstance(read.max_infra_failure_share, float)
    assert read.reward_fn is None and read.guards.served_weights is False and read.guards.max_logprob_gap == 0.0
    loop = read.agent_loop
    assert loop is not None and loop.timeout_s == 30.0 and loop.infra_exceptions == ("httpx:TransportError",)
    assert loop.tool_kwargs == {} and loop.own_client is False and loop.tool_factory == "/run/dir/workflow.pkl:tools"
    assert loop.budget == {"max_model_turns": 4, "max_tool_calls": None}


def test_a_budget_mapping_takes_every_field_of_a_budget_and_the_loop_builds_it() -> None:
    import dataclasses

    from rllm.integrations.strands import Budget
    from rllm.training.verl.settings import loop_settings

    for spec in dataclasses.fields(Budget):
        loop = {"tool_factory": "my_tools:tools", "budget": {spec.name: 5}}
        assert loop_settings({"rllm": {"agent_loop": loop}}).budget == Budget(**{spec.name: 5})


@functools.cache
def _composed(name: str, overrides: tuple[str, ...]) -> Any:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra.compose(config_name=name, overrides=list(overrides))


def _compose(name: str, *overrides: str) -> Any:
    """The recipe composed with ``overrides`` (a copy: composing verl's config takes seconds, so each is done once)."""
    return copy.deepcopy(_composed(name, overrides))


@pytest.mark.parametrize("name", RECIPES)
def test_the_shipped_recipes_parse(name: str) -> None:
    settings = read_settings(_compose(name))
    assert settings.guards == GuardSettings() and settings.max_infra_failure_share == 0.5
    assert settings.agent_loop is not None


def test_a_bad_value_stops_the_launch_when_the_config_is_prepared(tmp_path: Path) -> None:
    config = _compose("strands_agent_rloo", "rllm.guards.max_truncated_share=50",
                      f"trainer.default_local_dir={tmp_path}")
    with pytest.raises(ConfigurationError, match=r"^rllm\.guards\.max_truncated_share=50: expected a number from 0 "
                                                 r"to 1, or null \(the guard off\)$"):
        prepare_config(config)


def test_the_guards_and_the_launch_checks_read_the_block_through_the_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"rllm\.guards\.max_steps_without_signal=0: expected a whole number"):
        GuardSettings.from_mapping({"max_steps_without_signal": 0})
    from rllm.training.verl.train import check_launch

    config = prepare_config(_compose("strands_agent_rloo", f"trainer.default_local_dir={tmp_path}"))
    config.rllm.max_infra_failure_share = "half"  # changed after preparation: read again where it is checked
    with pytest.raises(ConfigurationError, match=r"rllm\.max_infra_failure_share='half'"):
        check_launch(config)


def _documented() -> dict[str, str]:
    """The key table of docs/training-verl.md, "The rllm block": key to its default as written."""
    rows = re.findall(r"^\| `(rllm\.[\w.]+)` \| `([^`]*)` \|", (REPO / "docs/training-verl.md").read_text(),
                      re.MULTILINE)
    return dict(rows)


def _shown(setting: Setting) -> str:
    default = list(setting.default) if isinstance(setting.default, tuple) else setting.default
    return yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("\n...").strip()


def test_the_docs_list_every_key_with_its_default() -> None:
    documented = _documented()
    keys = {s.key: s for s in SETTINGS if s.kind is not SECTION_KIND}
    assert sorted(documented) == sorted(keys), "docs/training-verl.md's table of the rllm block lists other keys"
    for key, setting in keys.items():
        assert documented[key] == _shown(setting), key


# ------------------------------------------------------------------------------- the launcher's overlays
BEFORE_CPU = [
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "++ray_kwargs.ray_init.num_cpus=16",
    "++ray_kwargs.ray_init.num_gpus=1",
    "++ray_kwargs.ray_init.include_dashboard=false",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.rollout.name=rllm_embedded",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.use_fused_kernels=true",
]
"""``CPU_OVERRIDES`` before the overlay replaced it: a change to ``config/overlay/cpu.yaml`` changes this too."""
BEFORE_SMOKE = [
    "actor_rollout_ref.rollout.name=rllm_embedded",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "trainer.total_training_steps=2",
    "trainer.total_epochs=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=${trainer.total_training_steps}",
    "trainer.logger=[console,file]",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
]
"""``SMOKE_OVERRIDES`` before the overlay replaced it (``config/overlay/smoke.yaml``)."""
FLAGS = {"--cpu": BEFORE_CPU, "--smoke": BEFORE_SMOKE}


@pytest.mark.parametrize("flags", [["--cpu"], ["--smoke"], ["--smoke", "--cpu"]], ids=lambda f: " ".join(f))
@pytest.mark.parametrize("name", RECIPES)
def test_the_flags_overlays_compose_what_their_override_lists_did(name: str, flags: list[str]) -> None:
    # Before: the launcher put --cpu's list first, then --smoke's, then the command line's overrides.
    before = [override for flag in ("--cpu", "--smoke") if flag in flags for override in FLAGS[flag]]
    user = ["trainer.total_epochs=7", "actor_rollout_ref.rollout.n=3"]  # the command line still wins
    old = OmegaConf.to_yaml(_compose(name, *before, *user))
    composed = _compose(name, *overlay_override(flag_overlays(flags)), *user)
    assert OmegaConf.to_yaml(composed) == old
    read_settings(composed)  # and the block still parses


def test_the_launchers_print_config_of_both_flags_is_the_recipe_with_both_lists(monkeypatch, capsys) -> None:
    """The launcher's own command line (``--print-config --smoke --cpu``): the overlays as its flags select them."""
    from rllm.training.verl.cpu import cpu_environment
    from rllm.training.verl.train import main

    for name in cpu_environment():  # --cpu sets them in the launcher's environment: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(sys, "argv", ["train"])
    main(["--print-config", "--smoke", "--cpu", "--config-name", "lookup_rloo", "actor_rollout_ref.model.path=/m"])
    config = _compose("lookup_rloo", *BEFORE_CPU, *BEFORE_SMOKE, "actor_rollout_ref.model.path=/m")
    OmegaConf.resolve(config)
    assert capsys.readouterr().out == OmegaConf.to_yaml(config)


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


@pytest.mark.parametrize("overlay", ["cpu", "smoke"])
def test_every_key_an_overlay_sets_is_one_the_recipes_have_or_one_it_adds_on_purpose(overlay: str) -> None:
    """An overlay merges what it holds, typo or not: each key must be the recipe's (verl's), or a known addition."""
    added = {"ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.include_dashboard",
             "actor_rollout_ref.model.override_config.attn_implementation"}  # the old list's ++ overrides
    keys = _leaves(yaml.safe_load((CONFIG_DIR / "overlay" / f"{overlay}.yaml").read_text()))
    for name in RECIPES:
        recipe = _compose(name)
        missing = [key for key in keys if key not in added and OmegaConf.select(recipe, key, default="<none>")
                   == "<none>"]
        assert not missing, f"{overlay}.yaml sets keys {name} lacks: {missing}"
