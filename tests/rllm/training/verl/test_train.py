"""The verl recipe: it composes with Hydra, passes verl's own validation, every key is live, RLOO
computes the expected advantages through verl's estimator, and the launcher's dry run, help and
retrieval health check behave as documented. CPU only; nothing here starts Ray or a GPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.ray_script import run_with_ray  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from rllm.errors import ConfigurationError  # noqa: E402
from rllm.training.verl.train import (  # noqa: E402
    CONFIG_DIR,
    CONFIG_NAME,
    VERL_CONFIG_SOURCE,
    _verl_config_by_file,
    prepare_config,
    validate,
)

REPO = Path(__file__).resolve().parents[4]

LAUNCHER = REPO / "examples" / "strands" / "train_strands_agent.sh"
# Keys the recipe adds that verl's base config does not declare, each with the reader that makes it live.
ADDED_KEYS = {
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "FSDP engine _build_fsdp_module",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": "FSDP engine _build_fsdp_module",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": "FSDP engine _build_fsdp_module",
    "rllm.guards.max_logprob_gap": "rllm.training.verl.settings.GuardSettings (GuardedTaskRunner)",
    "rllm.guards.logprob_audit_rollouts": "rllm.training.verl.trainer.runner audit_logprob_pairs (bypass mode)",
    "rllm.guards.min_rollouts_per_group": "rllm.training.verl.settings.GuardSettings, check_launch",
    "rllm.guards.max_truncated_share": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.max_steps_without_signal": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.max_context_overflow_share": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.max_steps_without_tool_calls": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.max_malformed_tool_call_share": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.max_steps_with_malformed_tool_calls": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.min_tool_calls_for_malformed_stop": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.warn_on_tool_collapse": "rllm.training.verl.settings.GuardSettings",
    "rllm.guards.served_weights": "rllm.training.verl.settings.GuardSettings, runner, check_launch",
    "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_ALLOW_INSECURE_SERIALIZATION":
        "vLLM's workers (collective_rpc of rllm.training.verl.weights.engine_weights), check_launch",
    "rllm.max_infra_failure_share": "rllm.training.verl.manager.StrandsAgentLoopManager",
    "rllm.rollout_records.every_n_steps": "rllm.training.verl.settings (GuardedTrainer's rollout records)",
    "rllm.rollout_records.max_per_step": "rllm.training.verl.settings (GuardedTrainer's rollout records)",
    "rllm.agent_loop.tool_factory": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.agent_factory": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.tool_kwargs.retrieval_url": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.system_prompt": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.budget": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.timeout_s": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.infra_exceptions": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.max_tokens_per_turn": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.own_client": "rllm.training.verl.settings.loop_settings",
    "rllm.agent_loop.task_to_prompt": "rllm.training.verl.settings.loop_settings, the launcher's task rows",
    "rllm.reward_fn": "rllm.training.verl.settings.loop_settings (StrandsAgentLoop scores with it), preflight",
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "verl.trainer.main_ppo TaskRunnerV1 (RolloutConfig)",
    "data.apply_chat_template_kwargs.enable_thinking": "chat template (RLHFDataset, StrandsAgentLoop)",
}


@pytest.fixture(autouse=True, scope="module")
def hotpotqa_rows(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The recipe's rows (two questions each), where the recipe reads them: the launcher tries the first one."""
    from fixtures.hotpotqa_rows import write_hotpotqa_rows

    root = write_hotpotqa_rows(tmp_path_factory.mktemp("hotpotqa"))
    previous = os.environ.get("HOTPOTQA_DIR")
    os.environ["HOTPOTQA_DIR"] = str(root)  # the launch script's subprocesses read it too
    yield root
    if previous is None:
        os.environ.pop("HOTPOTQA_DIR", None)
    else:
        os.environ["HOTPOTQA_DIR"] = previous


def compose(*overrides: str) -> Any:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra.compose(config_name=CONFIG_NAME, overrides=list(overrides))


def leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def declared(config: Any, key: str) -> bool:
    """Whether ``key`` exists in ``config`` (a ``???`` value counts: it is declared, just unset)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    return OmegaConf.is_dict(parent) and leaf in list(parent.keys())


def test_recipe_composes_and_passes_verls_validation() -> None:
    config = prepare_config(compose())
    validate(config)  # verl.utils.config.validate_config, as verl's main runs it

    assert config.algorithm.adv_estimator == "rloo"
    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert rollout.n == 8 and rollout.name == "vllm" and config.trainer.n_gpus_per_node == 8
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen3-4B"
    # fp16: the FSDP engine reads mixed_precision (param fp16, fp32 reduce and buffers); vLLM serves fp16.
    engine = omega_conf_to_dataclass(actor.fsdp_config)
    assert engine.mixed_precision == {"param_dtype": "fp16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert engine.model_dtype == "fp32" and rollout.dtype == "float16"
    # The rollout config verl's agent-loop workers build, with our lengths and loop.
    rollout_config = omega_conf_to_dataclass(rollout)
    assert rollout_config.prompt_length == 2048 and rollout_config.response_length == 6144
    assert rollout_config.max_model_len == 8192 and rollout_config.calculate_log_probs
    assert rollout_config.agent.default_agent_loop == "strands_agent"
    loops = OmegaConf.load(rollout.agent.agent_loop_config_path)
    assert Path(rollout.agent.agent_loop_config_path).is_absolute()
    assert [entry.name for entry in loops] == ["strands_agent"]
    assert loops[0]._target_ == "rllm.training.verl.agent_loop.StrandsAgentLoop"
    # One reward path: the loop scores with rllm.reward_fn and hands verl the score (verl's reward function
    # unnamed); no critic, no reference model (no KL).
    assert config.reward.custom_reward_function.path is None
    assert config.rllm.reward_fn == "rllm.agents.search:search_row_reward"
    assert compose().reward.num_workers > 0 and config.reward.num_workers == 0  # verl's reward workers: never called
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    assert not need_critic(config) and not need_reference_policy(config)
    assert config.rllm.agent_loop.tool_kwargs.retrieval_url.startswith("http")
    assert config.trainer.save_freq > 0 and config.trainer.test_freq > 0 and config.trainer.val_before_train


def test_the_lora_recipe_trains_an_adapter_on_one_gpu_served_by_the_embedded_backend() -> None:
    from rllm.training.verl.train import check_served_weights, uses_lora

    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = prepare_config(hydra.compose(config_name="strands_agent_rloo_lora", overrides=[
            "data.train_files=tasks.jsonl", "rllm.agent_loop.agent_factory=rllm.agents.lookup:lookup_agent"]))
    model = config.actor_rollout_ref.model
    assert uses_lora(config) and (model.lora_rank, model.lora_alpha, model.target_modules) == (32, 64, "all-linear")
    assert config.trainer.n_gpus_per_node == 1 and config.actor_rollout_ref.rollout.name == "rllm_embedded"
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp16"
    assert not config.actor_rollout_ref.model.lora.get("merge", False)
    check_served_weights(config)  # the served adapter can be proven here


def test_every_recipe_key_is_a_verl_key_or_a_documented_addition() -> None:
    keys = []
    for name in ("strands_base", CONFIG_NAME, "strands_agent_rloo", "strands_agent_rloo_lora"):
        recipe = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
        recipe.pop("hydra"), recipe.pop("defaults", None)
        keys += leaves(recipe)
    with hydra.initialize_config_module(config_module="verl.trainer.config", version_base=None):
        base = hydra.compose(config_name="ppo_trainer")
    unknown = sorted({key for key in keys if not declared(base, key)})
    assert sorted(unknown) == sorted(ADDED_KEYS), "a recipe key verl does not know (typo or dead key)"
    # fsdp_config.dtype is ignored by verl's FSDP engine: the recipe must not pretend to set it.
    base_recipe = yaml.safe_load((CONFIG_DIR / "strands_base.yaml").read_text())
    assert "dtype" not in base_recipe["actor_rollout_ref"]["actor"]["fsdp_config"]


def test_a_mistyped_override_fails_to_compose() -> None:
    with pytest.raises(Exception, match="mixed_precison"):
        compose("actor_rollout_ref.actor.fsdp_config.mixed_precison.param_dtype=fp16")


def test_rloo_on_two_groups_through_verls_estimator() -> None:
    config = compose()
    # Group "a": all 4 rollouts; group "b": 3 rollouts (its 4th was an excluded infrastructure failure).
    uids = np.array(["a", "a", "a", "a", "b", "b", "b"], dtype=object)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    lengths = [3, 5, 2, 4, 5, 1, 3]
    width = 5
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.float32)
    rewards = torch.zeros(len(lengths), width)
    rewards[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = scores  # score on the last token
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)]  # {uid}_{session}_{index}, as verl's v1 stores them

    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=config.algorithm.adv_estimator, gamma=config.algorithm.gamma,
        lam=config.algorithm.lam, num_repeat=config.actor_rollout_ref.rollout.n, config=config.algorithm,
    )

    # r_i minus the mean of the other rollouts of the same prompt.
    expected = torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 1 - 1 / 2, 1 - 1 / 2, 0 - 1.0])
    advantages = out.batch["advantages"]
    assert torch.allclose(advantages, expected.unsqueeze(-1) * mask, atol=1e-6)  # broadcast on the mask only
    assert torch.allclose(out.batch["returns"], advantages)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(LAUNCHER), *args], capture_output=True, text=True, env=environment,
                          timeout=600, cwd=REPO)


def test_launcher_help_prints_usage_and_the_resolved_config_without_gpu_or_server() -> None:
    result = _launch("--help", "trainer.total_training_steps=3",
                     RETRIEVAL_SERVER_URL=f"http://127.0.0.1:{_closed_port()}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("Usage: bash examples/strands/train_strands_agent.sh")
    printed = yaml.safe_load(result.stdout.split("Resolved config:\n", 1)[1])
    assert printed["algorithm"]["adv_estimator"] == "rloo"
    assert printed["trainer"]["total_training_steps"] == 3  # overrides pass through
    assert printed["data"]["train_files"] == os.environ["HOTPOTQA_DIR"] + "/train.parquet"
    assert "${" not in result.stdout.split("Resolved config:\n", 1)[1]  # resolved


def test_launcher_refuses_to_start_without_a_healthy_retrieval_server() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    result = _launch(RETRIEVAL_SERVER_URL=url)
    assert result.returncode != 0
    assert f"the agent's local_search cannot search {url}" in result.stderr
    assert "rag/launch_rag.sh" in result.stderr
    assert "Started a local Ray instance" not in result.stdout + result.stderr  # refused before Ray


def test_an_agent_without_the_search_tool_needs_no_retrieval_server(tmp_path: Path) -> None:
    from rllm.training.verl.preflight import preflight

    config = prepare_config(compose("rllm.agent_loop.tool_factory=null",
                                    "rllm.agent_loop.agent_factory=fixtures.user_agents:printing_agent",
                                    f"trainer.default_local_dir={tmp_path}"))
    assert preflight(config).retrieval == []
    assert preflight(prepare_config(compose())).retrieval == [("http://127.0.0.1:8000", None)]


def test_the_retrieval_token_is_in_neither_the_config_verl_prints_nor_rays_runtime_env(monkeypatch) -> None:
    """verl prints the resolved config and hands it to every tracker; Ray logs the runtime env. The token is in neither."""
    monkeypatch.setenv("RETRIEVAL_TOKEN", "sekrit-123")
    config = prepare_config(compose())
    validate(config)
    assert "sekrit-123" not in OmegaConf.to_yaml(config, resolve=True)  # what verl prints, tracks and builds
    leaked = prepare_config(compose("+ray_kwargs.ray_init.runtime_env.env_vars.RETRIEVAL_TOKEN=sekrit-123"))
    with pytest.raises(ConfigurationError, match="would print the secret"):
        validate(leaked)


def test_the_rollout_workers_receive_the_token_through_ray() -> None:
    """A worker without the variable (a node of a cluster) gets it from the run's secret store, by name."""
    run = run_with_ray(
        "import os\n"
        "from rllm.training.verl.secrets import receive_secrets, share_secrets\n"
        "store = share_secrets()\n"
        "@ray.remote(runtime_env={'env_vars': {'RETRIEVAL_TOKEN': ''}})\n"
        "def worker():\n"
        "    before = os.environ.get('RETRIEVAL_TOKEN')\n"
        "    return before, receive_secrets(), os.environ.get('RETRIEVAL_TOKEN')\n"
        "print(ray.get(worker.remote()))\n",
        cwd=REPO, env={**os.environ, "RETRIEVAL_TOKEN": "sekrit-456"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "('', ('RETRIEVAL_TOKEN',), 'sekrit-456')"


def test_the_recipe_installs_the_stopping_manager() -> None:
    config = prepare_config(compose())
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.agent.agent_loop_manager_class == "rllm.training.verl.manager.StrandsAgentLoopManager"
    assert config.rllm.max_infra_failure_share == 0.5
    from verl.utils.import_utils import load_class_from_fqn

    from rllm.training.verl.manager import StrandsAgentLoopManager

    assert load_class_from_fqn(rollout.agent.agent_loop_manager_class, "AgentLoopManager") is StrandsAgentLoopManager


@pytest.fixture(scope="module")
def smoke_cpu_dry_run() -> subprocess.CompletedProcess[str]:
    """``--dry-run --smoke --cpu`` with the token set: one launch (an ``import verl``) for the two tests reading it."""
    return _launch("--dry-run", "--smoke", "--cpu", RETRIEVAL_TOKEN="s3cret-token-value")


def test_launcher_dry_run_never_prints_the_token(smoke_cpu_dry_run: subprocess.CompletedProcess[str]) -> None:
    result = smoke_cpu_dry_run
    assert result.returncode == 0, result.stderr[-2000:]
    assert "s3cret-token-value" not in result.stdout + result.stderr
    assert "RETRIEVAL_TOKEN" not in yaml.safe_load(result.stdout).get("ray_kwargs", {}).get("ray_init", {}).get(
        "runtime_env", {}).get("env_vars", {})


@pytest.mark.parametrize(("override", "message"), [
    ("actor_rollout_ref.rollout.n=1", r"rollout.n=1: RLOO's baseline .* at least 2 rollouts per prompt"),
    ("trainer.use_v1=false", "v1 trainer only"),
    ("trainer.v1.trainer_mode=sync", "trainer.v1.trainer_mode=sync: the launcher runs .*trainer_mode=rllm_sync"),
    ("actor_rollout_ref.rollout.calculate_log_probs=false", "bypass_mode=true trains against the rollout's log-probs"),
    ("+rllm.guards.max_gap=1", r"unknown keys \['rllm.guards.max_gap'\]"),
    ("actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48",
     r"ppo_micro_batch_size_per_gpu=48 does not divide the 16 rows .* each of its 8 data-parallel rank\(s\) "
     r"\(actor.ppo_mini_batch_size=16 x rollout.n=8\)"),
    ("actor_rollout_ref.rollout.name=trtllm", r"rollout.name=trtllm: rllm compares the served weights with the "
                                              r"actor's .* for \['rllm_embedded', 'vllm', 'sglang'\] only; set "
                                              r"rllm.guards.served_weights=false"),
    ("~ray_kwargs.ray_init.runtime_env.env_vars.VLLM_ALLOW_INSECURE_SERIALIZATION",
     r"rollout.name=vllm with rllm.guards.served_weights on: .*VLLM_ALLOW_INSECURE_SERIALIZATION=1"),
    ("actor_rollout_ref.model.lora_rank=8", r"rollout.name=vllm with a LoRA actor: rllm compares the served LoRA "
                                            r"adapter with the actor's on rllm_embedded only \(vllm keeps adapters .*\); set "
                                            r"rllm.guards.served_weights=false"),
    ("actor_rollout_ref.rollout.name=rllm_embedded actor_rollout_ref.model.lora_rank=8 "
     "++actor_rollout_ref.model.lora.merge=true", r"lora.merge=true: rllm_embedded serves base plus the adapter"),
])
def test_what_would_not_be_real_training_is_refused_at_launch(override: str, message: str) -> None:
    from rllm.training.verl.train import check_launch

    with pytest.raises(ConfigurationError, match=message):
        check_launch(prepare_config(compose(*override.split())))


def test_the_served_weights_check_turned_off_is_a_setting_the_launcher_accepts(monkeypatch) -> None:
    from rllm.training.verl.train import check_launch

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    check_launch(prepare_config(compose()))  # the vLLM recipe sets what its check needs
    check_launch(prepare_config(compose("actor_rollout_ref.rollout.name=trtllm", "rllm.guards.served_weights=false",
                                        "~ray_kwargs.ray_init.runtime_env.env_vars.VLLM_ALLOW_INSECURE_SERIALIZATION")))


def test_the_cpu_mode_refuses_half_precision_at_launch(monkeypatch) -> None:
    from rllm.training.verl.cpu import CPU_OVERRIDES
    from rllm.training.verl.train import check_launch

    monkeypatch.setenv("RLLM_VERL_CPU", "1")
    check_launch(prepare_config(compose(*CPU_OVERRIDES)))
    for half in ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
                 "actor_rollout_ref.rollout.dtype=float16"):
        with pytest.raises(ConfigurationError, match="half precision does not train on CPU"):
            check_launch(prepare_config(compose(*CPU_OVERRIDES, half)))
    monkeypatch.delenv("RLLM_VERL_CPU")
    check_launch(prepare_config(compose()))  # the recipe's own fp16 stands on a GPU


def test_smoke_and_cpu_flags_compose_the_recipe_for_two_steps_on_this_machine(
        smoke_cpu_dry_run: subprocess.CompletedProcess[str]) -> None:
    result = smoke_cpu_dry_run
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["total_training_steps"] == 2 and config["trainer"]["n_gpus_per_node"] == 1
    rollout = config["actor_rollout_ref"]["rollout"]
    assert rollout["name"] == "rllm_embedded" and rollout["n"] == 2 and rollout["dtype"] == "float32"
    assert config["actor_rollout_ref"]["actor"]["strategy"] == "fsdp2"


def test_launcher_refuses_a_retrieval_server_that_rejects_the_token(tmp_path_factory) -> None:
    from rag.server import ServerSettings
    from rag.testing import RetrievalServer, demo_index

    index = demo_index(tmp_path_factory.getbasetemp(), 200)
    with RetrievalServer(index, ServerSettings(token="s3cret")) as server:
        result = _launch(RETRIEVAL_SERVER_URL=server.base_url, RETRIEVAL_TOKEN="")
        wrong = _launch(RETRIEVAL_SERVER_URL=server.base_url, RETRIEVAL_TOKEN="not-it")
    for run in (result, wrong):
        assert run.returncode != 0
        assert f"the agent's local_search cannot search {server.base_url}" in run.stderr  # /health alone would pass
        assert "RETRIEVAL_TOKEN" in run.stderr and "Started a local Ray instance" not in run.stdout + run.stderr
        assert "HTTP 401" in run.stderr and "set RETRIEVAL_TOKEN" in run.stderr
    assert "the client sent no token" in result.stderr and "a token it does not accept" in wrong.stderr


# ---------------------------------------------------------------- the loop's settings: the recipe alone
def test_the_loop_reads_its_settings_from_the_recipe_and_evaluations_budget(monkeypatch) -> None:
    from rllm.agents.search import DEFAULT_SEARCH_BUDGET
    from rllm.training.verl.agent_loop import loop_settings

    monkeypatch.setenv("RETRIEVAL_SERVER_URL", "http://10.0.0.7:8123")
    settings = loop_settings(prepare_config(compose()))
    assert settings.block.tool_factory == "rllm.agents.search:search_tools"
    assert settings.block.tool_kwargs == {"retrieval_url": "http://10.0.0.7:8123"}  # resolved by the launcher
    assert settings.budget == DEFAULT_SEARCH_BUDGET and settings.tool_parser == "hermes"
    assert settings.block.timeout_s == 600 and settings.infra_exceptions == () and settings.block.system_prompt is None
    # verl's own keys that this loop can honour, it honours.
    honoured = loop_settings(compose("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                                     "actor_rollout_ref.rollout.multi_turn.format=qwen3_coder"))
    assert honoured.budget.max_model_turns == 3 and honoured.budget.max_tool_calls == 16
    assert honoured.tool_parser == "qwen3_coder"
    mapped = loop_settings(compose("rllm.agent_loop.budget={max_model_turns:4,max_tool_calls:5}"))
    assert (mapped.budget.max_model_turns, mapped.budget.max_tool_calls) == (4, 5)


@pytest.mark.parametrize(("override", "message"), [
    ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512", "multi_turn.max_tool_response_length=512"),
    ("actor_rollout_ref.rollout.multi_turn.max_user_turns=4", "multi_turn.max_user_turns=4"),
    ("actor_rollout_ref.rollout.multi_turn.max_parallel_calls=4", "multi_turn.max_parallel_calls=4"),
    ("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true", "use_inference_chat_template=True"),
    ("actor_rollout_ref.rollout.multi_turn.format=llama3_json", "multi_turn.format: unknown tool parser"),
    ("+rllm.agent_loop.max_turns=4", r"unknown keys \['rllm.agent_loop.max_turns'\]"),
    ("rllm.agent_loop.tool_factory=null", "set either tool_factory"),
    ("rllm.agent_loop.agent_factory=fixtures.verl_loop:windowed_agent", "exactly one"),
    ("rllm.agent_loop.budget={max_turns:4}", r"budget=\{'max_turns': 4\}: unknown keys \['max_turns'\]"),
    ("rllm.agent_loop.own_client=true", "own_client: true serves an agent_factory's agent on its own client"),
    ("rllm.agent_loop.own_client=yes", "own_client='yes': expected true or false"),
], ids=["tool_response_length", "user_turns", "parallel_calls", "inference_template", "format", "unknown_key",
        "no_factory", "both_factories", "budget_key", "own_client_without_factory", "own_client_not_a_bool"])
def test_settings_the_loop_would_ignore_are_refused_at_launch(override: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        validate(prepare_config(compose(override)))  # the launcher's checks, before Ray starts


def test_settings_in_the_agent_loop_yaml_entry_are_refused(tmp_path) -> None:
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from rllm.training.verl.agent_loop import StrandsAgentLoop

    config = prepare_config(compose())
    with pytest.raises(ConfigurationError, match=r"\['max_model_turns', 'tool_factory'\].*rllm.agent_loop"):
        StrandsAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=None, processor=None,
                         dataset_cls=None, data_config=DictConfigWrap(config.data), tool_factory="x:y",
                         max_model_turns=3)


def test_the_recipes_and_the_launch_script_are_package_data() -> None:
    """A normal (non-editable) install has them: they are found through the packages, not a clone."""
    import importlib.resources

    from rllm.training.verl.train import CONFIG_DIR

    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"rllm.training.verl" = ["config/*.yaml", "config/overlay/*.yaml"]' in pyproject
    assert '"rag" = ["launch_rag.sh"]' in pyproject
    assert CONFIG_DIR == Path(str(importlib.resources.files("rllm.training.verl") / "config"))
    assert {p.name for p in CONFIG_DIR.glob("*.yaml")} == {"agent_loops.yaml", f"{CONFIG_NAME}.yaml", "lookup_rloo.yaml",
                                                          "strands_base.yaml", "strands_agent_rloo.yaml",
                                                          "strands_agent_rloo_lora.yaml"}
    assert {p.name for p in (CONFIG_DIR / "overlay").glob("*.yaml")} == {"cpu.yaml", "smoke.yaml"}
    assert (importlib.resources.files("rag") / "launch_rag.sh").is_file()



_PACKAGE_RECIPES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if "  - pkg://verl.trainer.config\n" in p.read_text())


@pytest.mark.parametrize("recipe", _PACKAGE_RECIPES)
def test_a_recipe_composes_the_same_with_verls_config_folder_named_by_file(recipe: str) -> None:
    # --help and --print-config name verl's config folder by file, which Hydra reads without importing verl.
    by_file = _verl_config_by_file(["--config-name", recipe], [])
    assert by_file and by_file[0].startswith("hydra.searchpath=[file://")
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        composed = [OmegaConf.to_container(hydra.compose(recipe, overrides=overrides))
                    for overrides in ([], by_file)]
    assert composed[0] == composed[1]
    assert len(OmegaConf.to_yaml(composed[0]).splitlines()) > 200  # verl's whole trainer config, not the recipe alone
    assert _verl_config_by_file(["--config-dir", "/elsewhere", "--config-name", recipe], []) == []  # no such recipe
    assert _verl_config_by_file(["--config-name", recipe], ["hydra.searchpath=[pkg://verl.trainer.config]"]) == []


def test_the_recipe_agent_trainer_writes_composes_the_same_with_verls_config_folder_named_by_file(
        tmp_path: Path) -> None:
    # AgentTrainer's run folder recipe (--config-dir) names verl's config package too: --print-config reads it by
    # file, and the launcher composes the same config either way.
    from fixtures.user_agents import TASKS, capital_agent, capital_reward

    from rllm.trainer import AgentTrainer
    from rllm.workflows import StrandsWorkflow

    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward}, None,
                           TASKS, cpu=True, output_dir=tmp_path / "run")
    recipe = trainer.write_run()
    options = ["--config-dir", str(recipe.parent), "--config-name", recipe.stem]
    by_file = _verl_config_by_file(options, [])
    assert by_file and by_file[0].startswith("hydra.searchpath=[file://")
    launcher = f"file://{CONFIG_DIR}"  # the launcher's own recipes, beside the run folder --config-dir adds
    with hydra.initialize_config_dir(config_dir=str(recipe.parent), version_base=None):
        composed = [OmegaConf.to_container(hydra.compose(recipe.stem, overrides=[f"hydra.searchpath=[{source},{launcher}]"]))
                    for source in (VERL_CONFIG_SOURCE, by_file[0].partition("[")[2].rstrip("]"))]
    assert composed[0] == composed[1]
    assert len(OmegaConf.to_yaml(composed[0]).splitlines()) > 200


def test_print_config_does_not_import_verl() -> None:
    probe = ("import sys, runpy; sys.argv = ['train', '--print-config']\n"
             "try:\n    runpy.run_module('rllm.training.verl.train', run_name='__main__')\n"
             "finally:\n    print('VERL IMPORTED' if 'verl' in sys.modules else 'VERL NOT IMPORTED', file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "VERL NOT IMPORTED" in result.stderr
    assert yaml.safe_load(result.stdout)["algorithm"]["adv_estimator"] == "rloo"
