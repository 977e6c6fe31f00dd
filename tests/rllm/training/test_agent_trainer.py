"""``AgentTrainer``: rLLM's signature over the workflow that evaluates, the run it writes, and what it refuses.

Fast checks of the run's files (rows, recipe, pickled objects) and of every refusal, plus one dry run of
the launcher on a factory and a reward defined inside a function (not importable: they travel pickled),
which the launcher loads, calls on the first task and accepts. Nothing here starts Ray.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
pytest.importorskip("verl", reason="AgentTrainer launches verl's trainer (the train extra)")
pytestmark = pytest.mark.verl

from fixtures.user_agents import TASKS, capital_agent, capital_of, capital_reward, country_prompt  # noqa: E402

from rllm.errors import ConfigurationError, TrainingRunError  # noqa: E402
from rllm.integrations.strands import Budget  # noqa: E402
from rllm.rewards.base import RewardOutput  # noqa: E402
from rllm.trainer import AgentTrainer  # noqa: E402
from rllm.training.agent_trainer import _hydra_value  # noqa: E402
from rllm.training.verl._dotted import import_object  # noqa: E402
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow, Workflow  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def _trainer(tmp_path: Path, **args: Any) -> AgentTrainer:
    workflow_args = {"agent_factory": capital_agent, "reward_fn": capital_reward, **args}
    return AgentTrainer(StrandsWorkflow, workflow_args, {"data.train_batch_size": 2}, TASKS,
                        output_dir=tmp_path / "run")


def test_the_run_names_importable_objects_by_path_and_keeps_each_task_whole(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, budget=Budget(max_model_turns=3, max_tool_calls=2),
                       model_kwargs={"params": {"max_tokens": 48}})
    recipe = yaml.safe_load(trainer.write_run().read_text())
    assert recipe["defaults"] == ["ppo_trainer", "strands_base", "_self_"]
    loop = recipe["rllm"]["agent_loop"]
    assert loop["agent_factory"] == "fixtures.user_agents:capital_agent"
    assert recipe["rllm"]["reward_fn"] == "fixtures.user_agents:capital_reward"
    assert loop["budget"] == {"max_model_turns": 3, "max_tool_iterations": None, "max_tool_calls": 2}
    assert loop["max_tokens_per_turn"] == 48
    assert not (tmp_path / "run" / "workflow.pkl").exists()  # nothing needed pickling
    # No val_dataset: validation off; the dict config goes on the command line, after --cpu's and --smoke's.
    assert recipe["trainer"]["test_freq"] == -1 and recipe["trainer"]["val_before_train"] is False
    assert trainer.command()[-1] == "data.train_batch_size=2"
    import pyarrow.parquet as pq

    from rllm.data.verl_rows import row_task

    rows = pq.read_table(recipe["data"]["train_files"]).to_pylist()
    assert [row_task(row) for row in rows] == TASKS


def test_objects_defined_in_a_function_travel_pickled_and_load_in_another_process(tmp_path: Path) -> None:
    answers: list[str] = []

    def local_agent(model: Any, task: dict[str, Any]) -> Any:
        return capital_agent(model, task)

    def local_reward(task: dict[str, Any], final_answer: str) -> float:
        answers.append(final_answer)
        return float(task["capital"] in final_answer)

    trainer = AgentTrainer(StrandsWorkflow, {"tools": [capital_of], "system_prompt": "Answer.",
                                             "reward_fn": local_reward}, None, TASKS, output_dir=tmp_path / "run")
    recipe = yaml.safe_load(trainer.write_run().read_text())
    pickled = str(tmp_path / "run" / "workflow.pkl")
    assert recipe["rllm"]["reward_fn"] == f"{pickled}:reward_fn"
    assert recipe["rllm"]["agent_loop"]["tool_factory"] == f"{pickled}:tools"
    assert recipe["rllm"]["agent_loop"]["system_prompt"] == "Answer."
    tools = import_object(f"{pickled}:tools")()
    assert [tool.tool_name for tool in tools] == ["capital_of"]
    assert import_object(f"{pickled}:reward_fn")(TASKS[0], "Paris") == 1.0
    # The launcher (another process) loads them, builds the agent and scores an empty answer on the first task.
    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": local_agent, "reward_fn": local_reward},
                           {"data.train_batch_size": 2}, TASKS, output_dir=tmp_path / "run2")
    config = trainer.dry_run()
    assert f"{tmp_path / 'run2' / 'workflow.pkl'}:agent_factory" in config


def test_a_dry_run_names_a_reward_that_returns_text(tmp_path: Path) -> None:
    def text_reward(task: dict[str, Any], final_answer: str) -> str:
        return "right"

    trainer = _trainer(tmp_path, reward_fn=text_reward)
    with pytest.raises(TrainingRunError, match="text_reward returned 'right'; it returns a RewardOutput"):
        trainer.dry_run()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workflow_class": Workflow}, "pass workflow_class=StrandsWorkflow"),
    ({"workflow_args": {"agent_factory": capital_agent}}, "reward_fn'] is required"),
    ({"workflow_args": {"agent_factory": capital_agent, "tools": [capital_of], "reward_fn": capital_reward}},
     "agent_factory (your agent) or tools"),
    ({"workflow_args": {"agent_factory": capital_agent, "reward_fn": capital_reward, "trace_store": "x.db"}},
     "rllm.agent_loop.own_client=true"),
    ({"workflow_args": {"agent_factory": capital_agent, "reward_fn": capital_reward, "max_turns": 3}},
     "unknown workflow_args ['max_turns']"),
    ({"workflow_args": {"agent_factory": capital_agent, "reward_fn": capital_reward,
                        "model_kwargs": {"params": {"temperature": 0.3}}}}, "model_kwargs ['temperature']"),
    ({"workflow_args": {"agent_factory": capital_agent, "reward_fn": capital_reward, "budget": {"max_model_turns": 3}}},
     "not a rllm.integrations.strands.Budget"),
    ({"workflow_args": {"agent_factory": "my_agents:my_agent", "reward_fn": capital_reward}}, "not a function"),
    ({"train_dataset": None}, "train_dataset is required"),
    ({"backend": "fireworks"}, "rllm trains with verl"),
    ({"config": "data.train_batch_size=2"}, "not the string"),
])
def test_what_training_cannot_honour_is_refused_naming_it(tmp_path: Path, kwargs: dict[str, Any],
                                                           message: str) -> None:
    args = {"workflow_class": StrandsWorkflow, "workflow_args": {"agent_factory": capital_agent,
                                                                 "reward_fn": capital_reward},
            "train_dataset": TASKS, "output_dir": tmp_path, **kwargs}
    with pytest.raises(ConfigurationError) as caught:
        AgentTrainer(**args)
    assert message in str(caught.value)


def test_the_same_workflow_args_evaluate() -> None:
    """What AgentTrainer takes is what AgentWorkflowEngine takes: the page's two steps share one dict."""
    from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply

    with ScriptedOpenAIServer(lambda body: ScriptedReply(content="Paris")) as server:
        from rllm.engine.rollout import OpenAIEngine

        engine = AgentWorkflowEngine(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward},
                                     OpenAIEngine("m", server.base_url), n_parallel_tasks=2)
        import asyncio

        episodes = asyncio.run(engine.execute_tasks(TASKS[:2], n_rollouts=1))
    assert [e.reward for e in episodes] == [1.0, 0.0] and isinstance(capital_reward(TASKS[0], "x"), RewardOutput)


@pytest.mark.parametrize("value", ["You are 'helpful', brief: {a, b} [c] ${x} \\n done\\", "a\\'b", 3, 0.5, None, True,
                                   ["a,b", 1], {"k": "v w"}])
def test_dict_config_values_survive_hydras_override_grammar(value: Any) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = OverridesParser.create().parse_overrides([f"a.b={_hydra_value(value)}"])
    assert override.value() == value


def test_fewer_tasks_than_a_batch_are_refused_before_ray_within_a_minute(tmp_path: Path) -> None:
    """The issue's first run: four tasks, no smoke, the recipe's batch of 64. It died after Ray on ZeroDivisionError."""
    import time

    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward}, None, TASKS,
                           cpu=True, output_dir=tmp_path / "run")
    started = time.monotonic()
    with pytest.raises(TrainingRunError, match=r"4 training task\(s\), fewer than data.train_batch_size=64: .* set "
                                               r"data.train_batch_size<=4"):
        trainer.train()
    assert time.monotonic() - started < 60
    assert "Started a local Ray instance" not in (tmp_path / "run" / "train.log").read_text()


def test_each_train_is_a_new_run_unless_resume_is_asked_and_a_resume_says_its_step(tmp_path: Path,
                                                                                 monkeypatch: Any) -> None:
    trainer = _trainer(tmp_path)
    assert yaml.safe_load(trainer.write_run().read_text())["trainer"]["resume_mode"] == "disable"
    resuming = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward},
                            {"data.train_batch_size": 2}, TASKS, output_dir=tmp_path / "run", resume=True)
    assert yaml.safe_load(resuming.write_run().read_text())["trainer"]["resume_mode"] == "auto"
    # An earlier run's checkpoint at step 1 and its metrics; the launcher stands in (it trains nothing).
    run = tmp_path / "run"
    (run / "global_step_1").mkdir()
    (run / "latest_checkpointed_iteration.txt").write_text("1")
    earlier = '{"step": 1, "data": {"critic/score/mean": 0.5}}\n'
    for each in (trainer, resuming):
        monkeypatch.setattr(each, "command", lambda **_: [sys.executable, "-c", "print('trained')"])
    (run / "metrics.jsonl").write_text(earlier)
    result = resuming.train()
    assert result.resumed_from_step == 1
    assert result.metrics == [{"step": 1, "critic/score/mean": 0.5}]  # the earlier steps stay in a resumed run's
    result = trainer.train()
    assert result.resumed_from_step is None and result.metrics == []  # a new run's metrics are its own


def test_task_to_prompt_is_written_into_the_recipe_and_a_list_of_task_files_is_one_dataset(tmp_path: Path) -> None:
    import json

    import pyarrow.parquet as pq

    from rllm.data.verl_rows import row_task

    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for file, tasks in zip(files, (TASKS[:2], TASKS[2:]), strict=True):
        file.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward,
                                             "task_to_prompt": country_prompt}, None, files, output_dir=tmp_path / "run")
    recipe = yaml.safe_load(trainer.write_run().read_text())
    assert recipe["rllm"]["agent_loop"]["task_to_prompt"] == "fixtures.user_agents:country_prompt"
    rows = pq.read_table(recipe["data"]["train_files"]).to_pylist()
    assert [row["extra_info"]["index"] for row in rows] == [0, 1, 2, 3] and [row_task(r) for r in rows] == TASKS
    assert rows[3]["prompt"] == [{"role": "user", "content": "Name the capital city of Peru."}]


@pytest.mark.parametrize(("val", "smoke", "expected"), [
    (True, True, {"val_before_train": True, "test_freq": 2, "save_freq": 2}),   # before the first step and at the last
    (False, True, {"val_before_train": False, "test_freq": -1, "save_freq": 2}),
    (True, False, {"val_before_train": True, "test_freq": 50, "save_freq": 50}),  # the recipe's
], ids=["smoke_with_val", "smoke_without_val", "recipe"])
def test_a_val_dataset_is_validated_before_and_at_the_end_even_in_a_smoke_run(
        tmp_path: Path, val: bool, smoke: bool, expected: dict[str, Any]) -> None:
    import subprocess

    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward}, None, TASKS,
                           val_dataset=TASKS[:2] if val else None, cpu=True, smoke=smoke, output_dir=tmp_path / "run")
    trainer.write_run()
    command = trainer.command()
    # The launcher composes exactly this command's recipe, overlays and overrides (--print-config starts nothing).
    proc = subprocess.run([*command[:3], "--print-config", *command[3:]], env=trainer._env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = yaml.safe_load(proc.stdout)["trainer"]
    assert {key: config[key] for key in expected} == expected
    # The user's config still wins over the smoke run's validation.
    user = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward},
                        {"trainer.test_freq": 1}, TASKS, val_dataset=TASKS[:2], smoke=True, output_dir=tmp_path / "u")
    assert user.command()[-1] == "trainer.test_freq=1"


def test_train_returns_the_runs_model_validation_and_curve(tmp_path: Path, monkeypatch) -> None:
    """``train()`` reads what the launcher left: here a stand-in launcher writes it as verl and the launcher do."""
    import sys
    import textwrap

    trainer = AgentTrainer(StrandsWorkflow, {"agent_factory": capital_agent, "reward_fn": capital_reward}, None, TASKS,
                           val_dataset=TASKS[:2], output_dir=tmp_path / "run")
    run = trainer.run_dir
    stand_in = textwrap.dedent(f"""
        import json, os
        from pathlib import Path
        from rllm.offline.tiny_models import build_tiny_model_dir
        from rllm.training.curves import draw_run_curve
        run = Path({str(run)!r})
        metrics = Path(os.environ["VERL_FILE_LOGGER_PATH"])
        val = {{"val-core/tasks/reward/mean@1": 0.5, "val-aux/tasks/tool_calls/mean@1": 1.0}}
        rows = [{{"step": 0, "data": val}}, {{"step": 1, "data": {{"critic/score/mean": 0.2, **val}}}}]
        metrics.write_text("".join(json.dumps(row) + "\\n" for row in rows))
        build_tiny_model_dir(run / "global_step_1" / "actor" / "huggingface")
        (run / "latest_checkpointed_iteration.txt").write_text("1")
        draw_run_curve(run, metrics)
    """)
    monkeypatch.setattr(trainer, "command", lambda **_: [sys.executable, "-c", stand_in])
    result = trainer.train()
    assert result.model_path == run / "global_step_1" / "actor" / "huggingface"
    assert sorted(result.validation) == [0, 1] and result.validation[1]["val-core/tasks/reward/mean@1"] == 0.5
    assert result.curve_path == run / "learning_curve.png" and result.curve_path.stat().st_size > 10_000
    assert [row["step"] for row in result.metrics] == [0, 1]
