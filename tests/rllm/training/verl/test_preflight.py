"""The launcher tries the user's agent, reward and data on the first task before Ray starts, naming what fails.

The recipe is the shipped ``strands_agent_rloo`` composed by Hydra as the launcher composes it; the
user's module is ``fixtures.user_agents`` (a plain Strands agent with one ``@tool``, tasks with fields of
their own, a ``RewardOutput`` reward) and the mistakes users make. Nothing here starts Ray or a model.
"""

from __future__ import annotations

import json
import logging
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
