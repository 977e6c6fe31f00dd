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
    callers = {"prepare_step": PPOTrainer.step, "on_init_end": PPOTrainer.init, "on_step_end": PPOTrainer.fit}
    assert set(callers) == set(verl_internals.TRAINER_CALLBACKS)
    for callback, caller in callers.items():
        assert f"self.{callback}()" in inspect.getsource(caller), f"verl no longer calls {callback}"
    # The guarded trainer logs a stopped step's metrics with verl's tracker, which fit makes and logs with.
    assert "self.logger = Tracking(" in fit and "self.logger.log(data=metrics, step=self.global_steps)" in fit
    tracker = object()
    assert verl_internals.trainer_tracker(type("Trainer", (), {"logger": tracker})()) is tracker
    assert verl_internals.trainer_tracker(object()) is None  # before fit


def test_verls_trainer_picks_its_synchronous_buffer_for_the_guarded_mode_only_under_as_sync_mode() -> None:
    from fixtures.verl_loop import compose
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from rllm.training.verl.trainer.guards import GUARDED_MODE
    from rllm.training.verl.trainer.runner import GuardedTrainer

    config = compose()
    assert config.trainer.v1.trainer_mode == GUARDED_MODE
    # verl's own synchronous trainer, given rllm's mode, takes its asynchronous replay buffer: verl branches on "sync".
    assert type(PPOTrainerSync(config).replay_buffer) is ReplayBufferAsync
    guarded = GuardedTrainer(config)
    assert type(guarded.replay_buffer) is ReplayBuffer and guarded.trainer_mode == verl_internals.SYNC_MODE
    assert config.trainer.v1.trainer_mode == GUARDED_MODE  # restored once verl has initialised
    with pytest.raises(RuntimeError), verl_internals.as_sync_mode(config):
        assert config.trainer.v1.trainer_mode == verl_internals.SYNC_MODE
        raise RuntimeError
    assert config.trainer.v1.trainer_mode == GUARDED_MODE
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


def test_verls_v1_worker_neither_scores_nor_stores_a_rollout_that_returned_no_sample(monkeypatch) -> None:
    # What lets StrandsAgentLoop.run drop a rollout by returning [] (and no reward or mask be needed for it).
    import asyncio

    import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    assert "await agent_loop.run(sampling_params, **kwargs)" in inspect.getsource(AgentLoopWorker._run_agent_loop)
    cls = verl_internals.ray_actor_class(agent_loop_tq.AgentLoopWorkerTQ)
    worker = cls.__new__(cls)

    async def reached(*args, **kwargs):
        raise AssertionError("verl scored or stored a rollout that returned no sample")

    worker._compute_score = reached
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", reached)
    assert asyncio.run(worker._agent_loop_postprocess([], False, uid="u", session_id=0)) is None
    with pytest.raises(AssertionError, match="scored or stored"):  # one sample would reach both
        asyncio.run(worker._agent_loop_postprocess([object()], False, uid="u", session_id=0))


def test_verls_agent_loop_manager_starts_the_worker_rllm_names_and_keeps_it_where_rllm_reads_it(monkeypatch) -> None:
    import ray
    from fixtures.verl_loop import compose
    from verl.trainer.main_ppo import TaskRunnerV1

    from rllm.training.verl.manager import StrandsAgentLoopManager, StrandsAgentLoopWorker

    # verl's task runner builds the configured manager with create(), which starts the workers after __init__.
    runner = inspect.getsource(verl_internals.ray_actor_class(TaskRunnerV1).init_agent_loop_manager)
    assert "self.agent_loop_manager = agent_loop_manager_cls.create(" in runner
    started: list[type] = []

    class ActorClass:  # what ray.remote(cls) hands verl: a class it starts actors of
        def __init__(self, cls: type) -> None:
            self.cls = cls

        def options(self, **options):
            return self

        def remote(self, *args):
            started.append(self.cls)
            return f"worker-{len(started)}"

    monkeypatch.setattr(ray, "remote", ActorClass)
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "a" * 56, "Alive": True, "Resources": {"CPU": 1.0}}])
    config = compose("actor_rollout_ref.rollout.agent.num_workers=2")
    manager = StrandsAgentLoopManager.create(config=config, llm_client=None, teacher_client=None,
                                             reward_loop_worker_handles=None)
    assert started == [StrandsAgentLoopWorker, StrandsAgentLoopWorker]
    assert verl_internals.agent_loop_workers(manager) == ["worker-1", "worker-2"]


def test_verls_server_manager_routes_to_the_server_and_address_a_replica_sets(monkeypatch) -> None:
    from types import SimpleNamespace

    import verl.workers.rollout.router as router
    from fixtures.verl_loop import compose
    from verl.workers.rollout.llm_server import LLMServerManager
    from verl.workers.rollout.replica import RolloutReplica

    seen: dict[str, list[str]] = {}

    class Replica(RolloutReplica):
        async def launch_servers(self) -> None:
            seen["workers"] = list(self.workers)  # verl hands the replica its workers first
            rank = self.replica_rank
            verl_internals.set_replica_servers(self, [f"server-{rank}", "second"], f"address-{rank}")

    class Manager(LLMServerManager):
        rollout_replica_class = Replica  # verl's hook for a recipe's replica class

    monkeypatch.setattr(router, "get_router_handle", lambda servers, **kwargs: servers)
    config = compose("actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    manager = Manager.create(config, worker_group=SimpleNamespace(world_size=1, workers=["fsdp-worker"]))
    (replica,) = verl_internals.rollout_replicas(SimpleNamespace(llm_server_manager=manager))
    assert seen["workers"] == ["fsdp-worker"]
    assert manager.global_load_balancer == {"address-0": "server-0"}  # generate calls go to the leading server
    assert replica.server_handle == "server-0" and replica.server_address == "address-0"
    assert replica.servers == ["server-0", "second"]  # wake_up, sleep, ... reach every one


def test_the_embedded_server_answers_every_call_verl_makes_on_a_rollout_server() -> None:
    import ast

    from verl.workers.rollout import llm_server, replica

    from rllm.training.verl.embedded.server import EmbeddedRolloutServer

    calls: dict[str, set[str]] = {}
    for module in (replica, llm_server):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"
                    and isinstance(node.func.value, ast.Attribute) and isinstance(node.func.value.value, ast.Name)
                    and node.func.value.value.id == "server"):
                calls.setdefault(node.func.value.attr, set()).update(k.arg for k in node.keywords if k.arg)
    assert set(calls) == set(verl_internals.SERVER_METHODS)
    assert calls["generate"] >= {"request_id", "prompt_ids", "sampling_params"}
    for name, keywords in calls.items():
        method = getattr(EmbeddedRolloutServer, name)
        assert inspect.iscoroutinefunction(method), name
        inspect.signature(method).bind(None, **dict.fromkeys(keywords))  # verl's keywords, each accepted


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


def test_verls_transfer_queue_rows_are_keyed_and_tagged_as_the_guards_read_them() -> None:
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from rllm.training.verl.trainer.advantage import rollout_of

    postprocess = inspect.getsource(AgentLoopWorkerTQ._agent_loop_postprocess)
    key = verl_internals.TQ_ROW_KEY
    assert f'keys.append(f"{key.replace("{index}", "{i}")}")' in postprocess  # one row per output, by index
    uid, session = verl_internals.TQ_UID, verl_internals.TQ_SESSION_ID
    assert f'uid, session_id = kwargs["{uid}"], kwargs["{session}"]' in postprocess
    assert "field.update(kwargs)" in postprocess  # uid, session_id and extra_info become the row's fields
    assert rollout_of(key.format(uid="0f3a", session_id="2", index=1)) == ("0f3a_2", 1)
    assert f'tag.get("{verl_internals.TQ_PADDING_TAG}", False)' in inspect.getsource(trainer_base)


def test_an_agent_loop_outputs_row_has_the_fields_the_guards_and_the_rloo_read() -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    output = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
                             response_logprobs=[-0.5, -0.25], reward_score=1.0, metrics=AgentLoopMetrics(),
                             extra_fields={"termination_reason": "env_done"})
    row = output.as_dict()
    assert row[verl_internals.TQ_PROMPTS].tolist() == [1, 2]
    assert row[verl_internals.TQ_RESPONSE_MASK].tolist() == [1, 1]
    assert row[verl_internals.TQ_ROLLOUT_LOG_PROBS].tolist() == [-0.5, -0.25]
    assert row[verl_internals.TQ_RM_SCORES].tolist() == [0.0, 1.0]  # the reward on the last response token
    assert row[verl_internals.TQ_EXTRA_FIELDS] == {"termination_reason": "env_done"}


def test_verls_trainer_writes_the_log_probs_and_advantages_rllm_reads_and_replaces() -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.dataset import rl_dataset

    old = inspect.getsource(PPOTrainer._compute_old_log_prob)
    assert (f'data["{verl_internals.TQ_OLD_LOG_PROBS}"] = '
            f'response_from_nested(data.pop("{verl_internals.TQ_LOG_PROBS}")') in old
    for option in (verl_internals.TQ_CALCULATE_ENTROPY, verl_internals.TQ_COMPUTE_LOSS, verl_internals.TQ_TEMPERATURE):
        assert f'"{option}":' in old, option
    advantage = inspect.getsource(PPOTrainer._compute_advantage)
    assert f'fields = ["{verl_internals.TQ_ADVANTAGES}", "{verl_internals.TQ_RETURNS}"]' in advantage
    read = (verl_internals.TQ_UID, verl_internals.TQ_RESPONSE_MASK, verl_internals.TQ_RM_SCORES)
    assert "fields = [" + ", ".join(f'"{name}"' for name in read) in advantage  # what it reads, rllm reads too
    dataset = inspect.getsource(rl_dataset)
    assert f'row_dict.get("{verl_internals.TQ_EXTRA_INFO}", {{}}).get("{verl_internals.TQ_ROW_INDEX}"' in dataset
