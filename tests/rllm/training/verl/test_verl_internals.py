"""One test per place rllm reaches into verl's or Ray's internals (``rllm.training.verl.verl_internals``).

Each test fails if verl (or Ray) renames what rllm uses or stops calling it where rllm relies on it
being called, so an upgrade cannot silently turn a guard, the embedded backend or the CPU mode off.
The real CPU runs (``test_train_cpu.py``, ``test_guard_faults_*.py``, ``test_examples_cpu.py``, the
quickstart's test) show the same seams working end to end.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

pytest.importorskip("verl", reason="verl is not installed: the seams need the train extra")

from fixtures.ray_script import run_with_ray  # noqa: E402

from rllm.errors import ConfigurationError  # noqa: E402
from rllm.training.verl import verl_internals  # noqa: E402

REPO = Path(__file__).resolve().parents[4]


def test_the_installed_verl_is_the_pinned_one_and_another_is_refused_at_launch(monkeypatch) -> None:
    import verl

    assert verl.__version__ == verl_internals.VERL_VERSION
    assert verl_internals.check_verl_version(strict=False) is None
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    assert "verl 0.10.0 is installed" in verl_internals.check_verl_version(strict=False)
    with pytest.raises(ConfigurationError, match="pinned to verl 0.9.1"):
        verl_internals.check_verl_version(strict=True)


def test_the_workers_rollout_registry_is_the_dict_verl_reads() -> None:
    from verl.workers.rollout import base

    verl_internals.register_worker_rollout("rllm_test_backend", "rllm.training.verl.embedded.adapter.EmbeddedServerAdapter")
    try:
        cls = base.get_rollout_class("rllm_test_backend", "async")
        assert cls.__name__ == "EmbeddedServerAdapter"
    finally:
        base._ROLLOUT_REGISTRY.pop(("rllm_test_backend", "async"), None)


def test_the_fsdp_worker_starts_its_process_group_through_the_function_rllm_wraps(monkeypatch) -> None:
    import verl.workers.engine_workers as engine_workers

    source = inspect.getsource(engine_workers)
    assert "initialize_global_process_group_ray(" in source  # called by name in the worker module
    seen = {}
    monkeypatch.setattr(engine_workers, "initialize_global_process_group_ray",
                        lambda timeout_second=None, backend=None: seen.update(backend=backend))
    verl_internals.use_gloo_process_group()
    engine_workers.initialize_global_process_group_ray(timeout_second=None)
    assert seen == {"backend": "cpu:gloo"}
    wrapped = engine_workers.initialize_global_process_group_ray
    verl_internals.use_gloo_process_group()  # idempotent: not wrapped twice
    assert engine_workers.initialize_global_process_group_ray is wrapped


def test_verls_trainer_still_calls_the_hooks_the_guarded_trainer_extends() -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    step_once = inspect.getsource(PPOTrainer._step_once)
    fit = inspect.getsource(PPOTrainer.fit)
    for hook in verl_internals.TRAINER_STEP_HOOKS:
        assert callable(getattr(PPOTrainer, hook)), hook
        assert f"self.{hook}(" in step_once + fit, f"verl no longer calls {hook}"
    assert "self.prepare_step()" in inspect.getsource(PPOTrainer.step)
    assert "self.on_step_end()" in fit


def test_verls_trainer_branches_on_the_sync_mode_and_the_guarded_trainer_is_registered_as_its_own() -> None:
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from rllm.training.verl.trainer.guards import GUARDED_MODE
    from rllm.training.verl.trainer.runner import GuardedTrainer

    init = inspect.getsource(PPOTrainer.__init__)
    assert "self.trainer_mode = self.config.trainer.v1.trainer_mode" in init  # read once, while initialising
    assert "self._build_replay_buffer()" in init
    # the synchronous replay buffer and refill rules are chosen by comparing the mode with "sync"
    assert f'self.trainer_mode == "{verl_internals.SYNC_MODE}"' in inspect.getsource(PPOTrainer._build_replay_buffer)
    assert get_trainer_cls(GUARDED_MODE) is GuardedTrainer and issubclass(GuardedTrainer, PPOTrainerSync)
    assert get_trainer_cls(verl_internals.SYNC_MODE) is PPOTrainerSync  # verl's own mode is left alone


def test_verls_agent_loop_worker_still_has_what_the_stopping_manager_extends() -> None:
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    cls = verl_internals.ray_actor_class(AgentLoopWorkerTQ)
    for hook in verl_internals.WORKER_HOOKS:
        assert callable(getattr(cls, hook)), hook
    source = inspect.getsource(inspect.getmodule(cls)) + inspect.getsource(cls.__mro__[1])
    assert "self._run_agent_loop(" in source and "self._agent_loop_postprocess(" in source
    for attribute in verl_internals.WORKER_ATTRIBUTES:
        assert f"self.{attribute}" in source, attribute
    # The worker passes run() its policy server and outcome as keywords; verl stores the rest of a
    # sample's keywords in its row, so _agent_loop_postprocess must take them out first.
    postprocess = inspect.getsource(AgentLoopWorkerTQ._agent_loop_postprocess)
    assert "field.update(kwargs)" in postprocess


def test_the_task_runner_is_a_ray_actor_class() -> None:
    from verl.trainer.main_ppo import TaskRunnerV1

    assert verl_internals.ray_actor_class(TaskRunnerV1).__name__ == "TaskRunnerV1"
    with pytest.raises(TypeError, match="not a Ray actor class"):
        verl_internals.ray_actor_class(object)


def test_the_actor_module_is_where_verls_fused_worker_keeps_it() -> None:
    import verl.single_controller.ray.base as ray_base
    import verl.workers.engine_workers as engine_workers

    assert "self.worker_dict = {}" in inspect.getsource(ray_base.create_colocated_worker_cls)
    assert "self.actor = self.actor_worker_cls(" in inspect.getsource(engine_workers.ActorRolloutRefWorker)
    assert "self.engine: BaseEngine = EngineRegistry.new(" in inspect.getsource(engine_workers.TrainingWorker)
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import trainer_base

    assert verl_internals.ACTOR_ROLES == (str(Role.ActorRollout), str(Role.ActorRolloutRef))
    assert "self.actor_rollout_wg = all_wg[str(actor_role)]" in inspect.getsource(trainer_base)


def test_a_function_runs_on_a_live_ray_actor() -> None:
    run = run_with_ray(
        "from rllm.training.verl.verl_internals import call_on_actor\n"
        "@ray.remote\n"
        "class Holder:\n"
        "    def __init__(self):\n"
        "        self.value = 41\n"
        "print(ray.get(call_on_actor(Holder.remote(), lambda actor, plus: actor.value + plus, 1)))\n",
        cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "42"


def test_the_rollout_replicas_and_their_servers_are_where_the_served_weights_check_reads_them() -> None:
    import ast

    import verl
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.rollout.llm_server import LLMServerManager
    from verl.workers.rollout.replica import RolloutReplica

    assert "self.llm_server_manager: LLMServerManager = LLMServerManager.create(" in inspect.getsource(trainer_base)
    assert "return self.rollout_replicas" in inspect.getsource(LLMServerManager.get_replicas)
    assert "self.servers: list[ActorHandle] = []" in inspect.getsource(RolloutReplica.__init__)
    assert isinstance(RolloutReplica.server_address, property)
    trainer = type("Trainer", (), {"llm_server_manager": type("M", (), {"get_replicas": lambda self: ["r"]})()})()
    assert verl_internals.rollout_replicas(trainer) == ["r"]
    # verl's vLLM and SGLang servers import only where those engines are installed: pinned from their source.
    root = Path(verl.__file__).parent / "workers" / "rollout"
    module, cls, method, parameters = verl_internals.VLLM_SERVER_RPC
    source = (root / "vllm_rollout" / "vllm_async_server.py").read_text()
    assert module == "verl.workers.rollout.vllm_rollout.vllm_async_server"
    server = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    rpc = next(n for n in server.body if isinstance(n, ast.AsyncFunctionDef) and n.name == method)
    assert tuple(a.arg for a in rpc.args.args + rpc.args.kwonlyargs) == parameters
    assert "await self.engine.collective_rpc(" in ast.get_source_segment(source, rpc)  # reaches vLLM's workers
    assert "self._server_handle = self.servers[0]" in source  # the first server leads the replica
    sglang = (root / "sglang_rollout" / "async_sglang_server.py").read_text()
    assert 'else f"{server_address}:{server_port}"' in sglang  # replica.server_address is SGLang's HTTP server
