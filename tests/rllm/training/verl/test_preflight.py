"""The launcher tries the user's agent, reward and data on the first task before Ray starts, naming what fails.

The recipe is the shipped ``strands_agent_rloo`` composed by Hydra as the launcher composes it; the
user's module is ``fixtures.user_agents`` (a plain Strands agent with one ``@tool``, tasks with fields of
their own, a ``RewardOutput`` reward) and the mistakes users make. Nothing here starts Ray or a model.
"""

from __future__ import annotations

import json
import logging
import re
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
pytest.importorskip("verl", reason="the launcher needs the train extra")

from fixtures.user_agents import TASKS  # noqa: E402

from rllm.errors import ConfigurationError  # noqa: E402
from rllm.training.verl.preflight import preflight  # noqa: E402
from rllm.training.verl.train import CONFIG_DIR, prepare_config  # noqa: E402

REPO = Path(__file__).resolve().parents[4]


def _tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    return path


def _config(tmp_path: Path, *overrides: str) -> Any:
    tasks = _tasks_file(tmp_path)
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = hydra.compose(config_name="strands_agent_rloo", overrides=[
            f"data.train_files={tasks}", f"data.val_files={tasks}", f"trainer.default_local_dir={tmp_path / 'run'}",
            "rllm.agent_loop.agent_factory=fixtures.user_agents:capital_agent",
            "rllm.reward_fn=fixtures.user_agents:capital_reward", *overrides])
    return prepare_config(config)


def test_the_users_factory_and_reward_get_their_own_task_dict_from_a_task_file(tmp_path: Path,
                                                                               caplog: Any) -> None:
    config = _config(tmp_path)
    # The JSONL task file became verl rows under the run's directory, each task kept whole.
    assert config.data.train_files == str(tmp_path / "run" / "data" / "train_files.parquet")
    with caplog.at_level(logging.INFO):
        checked = preflight(config)
    assert checked.task == TASKS[0]  # the user's own fields, unchanged
    assert checked.tool_names == ["capital_of"] and checked.retrieval == []  # no search tool: no retrieval server
    assert "each rollout's budget: Budget(max_model_turns=None" in caplog.text
    assert "rllm.agent_loop.budget unset: the defaults" in caplog.text


@pytest.mark.parametrize(("overrides", "message"), [
    (["rllm.agent_loop.agent_factory=fixtures.user_agents:capital_agnet"],
     "rllm.agent_loop.agent_factory=fixtures.user_agents:capital_agnet: cannot import"),
    (["rllm.reward_fn=fixtures.user_agents:capital_rewrd"],
     "rllm.reward_fn=fixtures.user_agents:capital_rewrd: cannot import"),
    (["rllm.reward_fn=fixtures.user_agents:text_reward"], "returned 'correct'; it returns a RewardOutput or a finite"),
    (["rllm.reward_fn=fixtures.user_agents:raising_reward"], "raised on the first training task with an empty answer"),
    (["rllm.agent_loop.agent_factory=fixtures.user_agents:raising_agent"],
     "raised on the first training task (KeyError: 'region')"),
    (["rllm.agent_loop.agent_factory=fixtures.user_agents:other_model_agent"], "on another model (OpenAIModel)"),
    (["rllm.reward_fn=null"], "no reward: set rllm.reward_fn"),
    (["+rllm.reward_kwargs=1"], "unknown keys ['rllm.reward_kwargs']"),
    (["+reward.custom_reward_function.reward_kwargs.scorer=fixtures.verl_faults:varied_score"],
     "rllm.reward_fn and reward.custom_reward_function.reward_kwargs.scorer are both set"),
    (["rllm.reward_fn=null", "+reward.custom_reward_function.reward_kwargs.scorer=fixtures.verl_faults:varied_score"],
     "reward.custom_reward_function.reward_kwargs.scorer=fixtures.verl_faults:varied_score: rllm reads no scorer "
     "there any more: the loop scores with rllm.reward_fn and hands verl the score"),
    (["reward.custom_reward_function.path=pkg://rllm.training.verl.reward"],
     "reward.custom_reward_function.path=pkg://rllm.training.verl.reward is gone"),
    (["reward.custom_reward_function.path=my_reward.py"],
     "rllm.reward_fn and reward.custom_reward_function.path=my_reward.py are both set"),
    (["rllm.agent_loop.budget={max_turns: 3}"], "unknown keys ['max_turns']"),
])
def test_a_mistake_in_the_users_code_is_refused_naming_it(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        preflight(_config(tmp_path, *overrides))
    assert message in str(caught.value)


def test_a_task_file_whose_tasks_have_no_question_is_refused_naming_the_task(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"country": "France"}]))
    with pytest.raises(ConfigurationError, match="train task 0: task \\? has no 'question', 'prompt' or 'problem'"):
        _config(tmp_path, f"data.train_files={path}")


def test_dry_run_refuses_a_misspelled_factory_within_seconds_before_ray(tmp_path: Path) -> None:
    tasks = _tasks_file(tmp_path)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rllm.training.verl.train", "--dry-run", "--config-name", "strands_agent_rloo",
         f"data.train_files={tasks}", f"data.val_files={tasks}", f"trainer.default_local_dir={tmp_path / 'run'}",
         "rllm.agent_loop.agent_factory=fixtures.user_agents:capital_agnet",
         "rllm.reward_fn=fixtures.user_agents:capital_reward"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    assert proc.returncode != 0
    assert "rllm.agent_loop.agent_factory=fixtures.user_agents:capital_agnet: cannot import" in proc.stderr
    assert "ray" not in proc.stderr.lower().replace("array", "")  # refused before Ray was started
    assert time.monotonic() - started < 120  # seconds (verl's import is most of it), not minutes


# ---------------------------------------------------------------- the run's size, before Ray


def _launch_log(config: Any, caplog: Any) -> str:
    from rllm.training.verl.train import check_launch

    with caplog.at_level(logging.INFO):
        check_launch(config)
    return caplog.text


def test_fewer_tasks_than_a_batch_is_refused_at_launch_naming_the_numbers_and_the_fix(tmp_path: Path) -> None:
    """The issue's case: four tasks and the recipe's batch of 64 died minutes in, after Ray, on ZeroDivisionError."""
    from rllm.training.verl.train import check_launch

    with pytest.raises(ConfigurationError) as caught:
        check_launch(_config(tmp_path))
    assert str(caught.value) == (
        "4 training task(s), fewer than data.train_batch_size=64: verl's dataloader drops the incomplete batch and "
        "would train no step; set data.train_batch_size<=4 (and actor_rollout_ref.actor.ppo_mini_batch_size<=it, "
        "dividing it), or give more tasks")
    with pytest.raises(ConfigurationError, match="^2 training task"):  # verl's train_max_samples keeps 2 of them
        check_launch(_config(tmp_path, "data.train_batch_size=4", "data.train_max_samples=2"))


def test_the_launch_log_says_tasks_batch_steps_and_when_validation_runs(tmp_path: Path, caplog: Any) -> None:
    text = _launch_log(_config(tmp_path, "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"),
                       caplog)
    assert ("the run: 4 training tasks, 4 validation tasks; data.train_batch_size=2 prompts x rollout.n=8 per step "
            "(1 optimizer update(s) of ppo_mini_batch_size=2); 2 steps per epoch, 2 steps in all; validation: before "
            "training, every 50 steps, at the end (step 2), on 4 tasks") in text
    assert f"a new run in {tmp_path / 'run'} (trainer.resume_mode=disable)" in text  # the recipes' default


@pytest.mark.parametrize(("overrides", "steps_per_epoch", "total", "validation", "logged"), [
    # verl: steps_per_epoch = tasks // batch (drop_last); total = total_training_steps or steps_per_epoch x epochs
    (["data.train_batch_size=3"], 1, 1, "before training, every 50 steps, at the end (step 1), on 4 tasks",
     "1 training task(s) past the last whole batch of data.train_batch_size=3 are left out of each epoch"),
    (["trainer.total_epochs=3", "trainer.test_freq=2", "trainer.val_before_train=false"], 2, 6,
     "every 2 steps, at the end (step 6), on 4 tasks", ""),
    (["trainer.total_training_steps=3", "trainer.total_epochs=2"], 2, 3,
     "before training, every 50 steps, at the end (step 3), on 4 tasks", ""),
    # fit() also stops after total_epochs: step 2, where verl's last step (5) would have validated and saved
    (["trainer.total_training_steps=5"], 2, 2, "before training, every 50 steps, on 4 tasks",
     "trainer.total_training_steps=5 is not reached: trainer.total_epochs=1 epoch(s) of 2 step(s) end the run at "
     "step 2, without the last step's checkpoint and validation; raise trainer.total_epochs to 3"),
    (["trainer.val_before_train=false", "trainer.test_freq=-1", "data.val_files=null"], 2, 2, "off", ""),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=16"], 2, 2,
     "before training, every 50 steps, at the end (step 2), on 4 tasks",
     "actor_rollout_ref.actor.ppo_mini_batch_size=16 does not divide data.train_batch_size=2: verl pads each step's "
     "last optimizer update with no-op rows, so that update averages over 2 prompt(s)"),
])
def test_the_size_mirrors_how_verls_trainer_counts_steps(tmp_path: Path, caplog: Any, overrides: list[str],
                                                         steps_per_epoch: int, total: int, validation: str,
                                                         logged: str) -> None:
    from rllm.training.verl.preflight import check_sizing

    config = _config(tmp_path, "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", *overrides)
    with caplog.at_level(logging.INFO):
        sizing = check_sizing(config)
    assert (sizing.train_tasks, sizing.steps_per_epoch, sizing.total_steps) == (4, steps_per_epoch, total)
    assert sizing.validation == validation
    assert logged in caplog.text


def test_validation_without_validation_tasks_is_refused(tmp_path: Path) -> None:
    from rllm.training.verl.preflight import check_sizing

    with pytest.raises(ConfigurationError, match=r"validation runs \(before training, every 50 steps, at the end "
                                                 r"\(step 2\)\) and data.val_files holds no tasks"):
        check_sizing(_config(tmp_path, "data.train_batch_size=2", "data.val_files=null"))


# ---------------------------------------------------------------- a new run, or a resumed one


def _earlier_run(run_dir: Path, steps: list[int], tracker: int | None, shards: bool = True) -> None:
    """What verl leaves in its run directory: global_step_N folders (the actor's model shard, with ``shards``) and
    the tracker of the last one."""
    for step in steps:
        (run_dir / f"global_step_{step}" / "actor" / "huggingface").mkdir(parents=True)
        if shards:
            (run_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    if tracker is not None:
        (run_dir / "latest_checkpointed_iteration.txt").write_text(str(tracker))


def test_a_new_run_removes_an_earlier_runs_checkpoints_and_says_which(tmp_path: Path, caplog: Any) -> None:
    from rllm.training.verl.preflight import clear_earlier_run
    from rllm.training.verl.train import plan_launch

    config = _config(tmp_path, "data.train_batch_size=2")
    run_dir = tmp_path / "run"
    _earlier_run(run_dir, [1, 2], tracker=2)
    assert "the earlier run's global_step_1, global_step_2, latest_checkpointed_iteration.txt will be removed when " \
           "it starts" in _launch_log(config, caplog)  # the dry run removes nothing
    assert (run_dir / "global_step_2").is_dir()
    with caplog.at_level(logging.INFO):
        clear_earlier_run(plan_launch(config))
    assert sorted(path.name for path in run_dir.iterdir()) == ["data"]  # the rows the launcher wrote stay
    assert (f"a new run in {run_dir}: removed the earlier run's global_step_1, global_step_2, "
            "latest_checkpointed_iteration.txt (trainer.resume_mode=disable; resume it with "
            "trainer.resume_mode=auto, AgentTrainer(resume=True))") in caplog.text


def test_a_resumed_run_says_the_step_it_resumes_from_and_removes_nothing(tmp_path: Path, caplog: Any) -> None:
    from rllm.training.verl.preflight import clear_earlier_run
    from rllm.training.verl.train import plan_launch

    config = _config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=auto")
    _earlier_run(tmp_path / "run", [1], tracker=1)
    assert f"resuming from step 1 of 2 ({tmp_path / 'run'})" in _launch_log(config, caplog)
    start = plan_launch(config)
    assert start.resume_step == 1
    clear_earlier_run(start)
    assert (tmp_path / "run" / "global_step_1").is_dir()
    # resume_path: the step of the folder it names, as verl reads it
    path = tmp_path / "run" / "global_step_1"
    assert plan_launch(_config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=resume_path",
                               f"trainer.resume_from_path={path}")).resume_step == 1
    # auto with nothing to resume: a new run, as verl trains from scratch
    (tmp_path / "other").mkdir()
    assert plan_launch(_config(tmp_path / "other", "data.train_batch_size=2",
                               "trainer.resume_mode=auto")).resume_step is None


def test_a_resume_with_nothing_left_to_train_is_refused_saying_the_run_is_finished(tmp_path: Path) -> None:
    from rllm.training.verl.train import check_launch

    _earlier_run(tmp_path / "run", [1, 2], tracker=2)
    with pytest.raises(ConfigurationError) as caught:
        check_launch(_config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=auto"))
    assert str(caught.value).startswith(f"trainer.resume_mode=auto: the run in {tmp_path / 'run'} finished at step 2 "
                                        "of 2; nothing is left to train. To train more, raise "
                                        "trainer.total_training_steps (or trainer.total_epochs) above 2 and resume")
    check_launch(_config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=auto", "trainer.total_epochs=2"))


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.resume_mode=latest"], "trainer.resume_mode=latest: verl takes auto, disable, resume_path"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_from_path=None: name an existing checkpoint folder"),
    (["trainer.resume_mode=resume_path", "trainer.resume_from_path=run/global_step_9"],
     "trainer.resume_from_path=run/global_step_9: name an existing checkpoint folder, global_step_N"),
])
def test_a_resume_that_verl_could_not_follow_is_refused(tmp_path: Path, overrides: list[str], message: str) -> None:
    from rllm.training.verl.train import plan_launch

    with pytest.raises(ConfigurationError, match=re.escape(message)):
        plan_launch(_config(tmp_path, "data.train_batch_size=2", *overrides))


def test_a_resumed_runs_metrics_file_keeps_the_earlier_steps(tmp_path: Path) -> None:
    """verl's file logger opens its file for writing: the earlier steps up to the resumed one are put back first."""
    from rllm.training.verl.train import _earlier_metrics_kept

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": step, "data": {"x": step}}) + "\n" for step in (1, 2, 3)))
    with _earlier_metrics_kept(path, 2):
        path.write_text(json.dumps({"step": 3, "data": {"x": 30}}) + "\n")  # what the resumed run writes
    assert [json.loads(line)["data"]["x"] for line in path.read_text().splitlines()] == [1, 2, 30]
    with _earlier_metrics_kept(path, None):  # a new run: verl's file alone
        path.write_text(json.dumps({"step": 1, "data": {"x": 100}}) + "\n")
    assert [json.loads(line)["data"]["x"] for line in path.read_text().splitlines()] == [100]


# ---------------------------------------------------------------- several task files, task_to_prompt, rewards


def _ids(path: str) -> list[int]:
    import pyarrow.parquet as pq

    return [row["extra_info"]["index"] for row in pq.read_table(path).to_pylist()]


def test_several_task_files_get_row_ids_unique_across_the_files(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.json"
    first.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    second.write_text(json.dumps(TASKS[:2]))
    config = _config(tmp_path, f"data.train_files=[{first},{second}]", "data.train_batch_size=2")
    files = list(config.data.train_files)
    assert files == [str(tmp_path / "run" / "data" / f"train_files_{i}.parquet") for i in (0, 1)]
    assert (_ids(files[0]), _ids(files[1])) == ([0, 1, 2, 3], [4, 5])
    from rllm.training.verl.preflight import check_sizing

    assert check_sizing(config).train_tasks == 6


def test_rows_files_with_colliding_ids_are_refused_naming_both(tmp_path: Path) -> None:
    from rllm.data.verl_rows import task_rows, write_parquet

    a = write_parquet(task_rows(TASKS, "train"), tmp_path / "a.parquet")
    b = write_parquet(task_rows(TASKS[:2], "train", first_index=3), tmp_path / "b.parquet")
    with pytest.raises(ConfigurationError) as caught:
        _config(tmp_path, f"data.train_files=[{a},{b}]")
    assert str(caught.value).startswith(f"data.train_files: {a} and {b} both hold the row with extra_info.index=3")
    c = write_parquet(task_rows(TASKS[:2], "train", first_index=4), tmp_path / "c.parquet")
    tasks = _tasks_file(tmp_path)
    config = _config(tmp_path, f"data.train_files=[{a},{c},{tasks}]")  # a task file after rows: numbered after them
    assert _ids(config.data.train_files[2]) == [6, 7, 8, 9]


def test_the_recipe_path_takes_task_to_prompt(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    # "+": the shipped recipes do not list the key yet (it defaults to null); AgentTrainer's recipe writes it
    config = _config(tmp_path, "+rllm.agent_loop.task_to_prompt=fixtures.user_agents:country_prompt")
    (row, *_) = pq.read_table(config.data.train_files).to_pylist()
    assert row["prompt"] == [{"role": "user", "content": "Name the capital city of France."}]
    with pytest.raises(ConfigurationError, match="rllm.agent_loop.task_to_prompt=fixtures.user_agents:country_promt: "
                                                 "cannot import"):
        _config(tmp_path, "+rllm.agent_loop.task_to_prompt=fixtures.user_agents:country_promt")


def test_a_reward_returning_nan_is_refused_at_preflight_naming_the_task(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        preflight(_config(tmp_path, "rllm.reward_fn=fixtures.user_agents:nan_reward"))
    assert str(caught.value) == ("rllm.reward_fn=fixtures.user_agents:nan_reward: reward function nan_reward "
                                 "returned RewardOutput(reward=nan); it returns a RewardOutput or a finite number "
                                 "(scoring the task {'capital': 'Paris', 'country': 'France', 'question': 'What is "
                                 "the capital of France?'})")


def test_resuming_a_checkpoint_without_model_shards_is_refused(tmp_path: Path) -> None:
    # A smoke run saves only its Hugging Face model; verl would resume its step count on the base weights.
    from rllm.training.verl.train import plan_launch

    _earlier_run(tmp_path / "run", [1], tracker=1, shards=False)
    with pytest.raises(ConfigurationError, match=r"trainer.resume_mode=auto: the checkpoint .*global_step_1 holds no "
                                                 r"model shards to resume from"):
        plan_launch(_config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=auto"))
    with pytest.raises(ConfigurationError, match="holds no model shards"):
        plan_launch(_config(tmp_path, "data.train_batch_size=2", "trainer.resume_mode=resume_path",
                            f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_1'}"))


def test_verls_checkpoint_manager_loads_the_model_from_the_shards_the_resume_check_looks_for() -> None:
    import inspect

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from rllm.training.verl.preflight import MODEL_SHARD_PREFIX

    source = inspect.getsource(FSDPCheckpointManager.load_checkpoint)
    assert f'f"{MODEL_SHARD_PREFIX}{{self.world_size}}_rank_{{self.rank}}.pt"' in source
