"""The launcher measures every task's first prompt before Ray, drops the tasks that cannot fit, refuses none fitting.

Real artifacts: Qwen's real tokenizer with the Qwen3 chat template trl ships, saved as a model directory the
recipe names (``actor_rollout_ref.model.path``); the user's agent factory (``fixtures.user_agents``), a ``Swarm``
factory and a tool factory (``fixtures.verl_loop``). The measure is checked against what ``StrandsAgentLoop``,
built as verl's worker builds it, sends as the first prompt of the same rows. Nothing here starts Ray or a model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import hydra
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
pytest.importorskip("verl", reason="the launcher needs the train extra")

from fixtures.user_agents import TASKS  # noqa: E402
from fixtures.verl_loop import SAMPLING, FakeServerManager, build_loop  # noqa: E402

from rllm.data.verl_rows import row_task  # noqa: E402
from rllm.errors import ConfigurationError  # noqa: E402
from rllm.offline.chat_templates import load_chat_template  # noqa: E402
from rllm.offline.qwen_tokenizer import build_qwen_tokenizer  # noqa: E402
from rllm.tracing import PolicyServer  # noqa: E402
from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV  # noqa: E402
from rllm.training.verl.agent_loop import POLICY_SERVER_KWARG  # noqa: E402
from rllm.training.verl.prompt_fit import fit_prompts  # noqa: E402
from rllm.training.verl.train import CONFIG_DIR, prepare_config, validate  # noqa: E402

LIMIT = 512
LONG = " Answer only after you have thought it through at great length." * 60  # ~700 tokens more
# Eight tasks, three of them with a question too long for the limit whatever the agent adds.
FIT_TASKS = [{**task, "question": task["question"] + (LONG if index in (1, 4, 6) else "")}
             for index, task in enumerate(TASKS * 2)]
AGENTS = {
    "factory": {"rllm.agent_loop.agent_factory": "fixtures.user_agents:capital_agent"},
    "swarm": {"rllm.agent_loop.agent_factory": "fixtures.verl_loop:research_team"},
    "tools": {"rllm.agent_loop.tool_factory": "fixtures.verl_loop:lookup_tools",
              "rllm.agent_loop.system_prompt": "'Answer with the city. Use the lookup tool.'"},
    "own_client": {"rllm.agent_loop.agent_factory": "fixtures.verl_loop:capital_agent_on_its_own_client",
                   "rllm.agent_loop.own_client": True},
}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen's real tokenizer and the Qwen3 chat template, as a directory verl loads its tokenizer from."""
    path = tmp_path_factory.mktemp("qwen3") / "tokenizer"
    build_qwen_tokenizer(load_chat_template("qwen3")).save_pretrained(path)
    return path


def _tasks_file(tmp_path: Path, tasks: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def _config(tmp_path: Path, model: Path | str, agent: str, tasks: list[dict[str, Any]] = FIT_TASKS,
            limit: int = LIMIT, *overrides: str) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = _tasks_file(tmp_path, tasks)
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = hydra.compose(config_name="strands_agent_rloo", overrides=[
            f"data.train_files={path}", f"data.val_files={path}", f"trainer.default_local_dir={tmp_path / 'run'}",
            f"actor_rollout_ref.model.path={model}", f"data.max_prompt_length={limit}",
            "rllm.reward_fn=fixtures.user_agents:capital_reward",
            *(f"{key}={value}" for key, value in AGENTS[agent].items()), *overrides])
    return prepare_config(config)


async def _loop_first_prompts(qwen_dir: Path, agent: str, rows: list[dict[str, Any]]) -> list[int]:
    """The first prompt ``StrandsAgentLoop`` sends verl's server for each row, in tokens (no length limit)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    settings = {key.rsplit(".", 1)[1]: value.strip("'") if isinstance(value, str) else value
                for key, value in AGENTS[agent].items()}
    policy = PolicyServer()  # what a worker serves an agent on its own client
    server = FakeServerManager(tokenizer, lambda prompt: "Paris")
    loop, _ = build_loop(tokenizer, server, "data.max_prompt_length=4096", "data.max_response_length=256",
                         "actor_rollout_ref.rollout.max_model_len=8192",
                         "rllm.reward_fn=fixtures.user_agents:capital_reward", stand_in_tool=False,
                         **{"tool_factory": None, "tool_kwargs": {}, "system_prompt": None, **settings})
    lengths = []
    for index, row in enumerate(rows):
        calls = len(server.calls)
        await loop.run(dict(SAMPLING), **{**row, "raw_prompt": row["prompt"], "index": index, "uid": f"u-{index}",
                                          "session_id": 0, "global_steps": 1, POLICY_SERVER_KWARG: policy})
        lengths.append(len(server.calls[calls]["prompt_ids"]))
    await policy.stop()
    return lengths


@pytest.mark.parametrize("agent", list(AGENTS))
def test_tasks_whose_first_prompt_cannot_fit_are_dropped_and_counted(tmp_path: Path, qwen_dir: Path,
                                                                    agent: str, caplog: Any, monkeypatch: Any) -> None:
    for name in (BASE_URL_ENV, API_KEY_ENV, MODEL_ENV):  # the loop exports its policy server's address
        monkeypatch.delenv(name, raising=False)
    config = _config(tmp_path, qwen_dir, agent)
    rows_file = config.data.train_files
    rows = pq.read_table(rows_file).to_pylist()
    user_file = (tmp_path / "tasks.jsonl").read_bytes()
    with caplog.at_level(logging.INFO, logger="rllm.training.verl.prompt_fit"):
        train, val = fit_prompts(config)
    assert not {BASE_URL_ENV, API_KEY_ENV, MODEL_ENV} & set(os.environ)  # the measure's own server left nothing

    # The measure is the first prompt the rollout sends (system prompt, tool schemas, the Swarm's context, task).
    assert train.lengths == asyncio.run(_loop_first_prompts(qwen_dir, agent, rows))
    assert [index for _, index in train.dropped] == [1, 4, 6]
    assert all(length > LIMIT for length in (train.lengths[i] for i in (1, 4, 6)))
    assert max(length for i, length in enumerate(train.lengths) if i not in (1, 4, 6)) <= LIMIT
    assert f"data.train_files: 3 of 8 training tasks dropped: their first prompt is longer than " \
           f"data.max_prompt_length={LIMIT} (the longest has {train.longest} tokens); the 5 kept" in caplog.text
    assert "data.val_files: 3 of 8 validation tasks dropped" in caplog.text
    # The run reads the kept rows, written under its own directory; the user's file is as it was.
    kept = tmp_path / "run" / "data" / "train_files.fit.parquet"
    assert config.data.train_files == str(kept) and train.files == [str(kept)]
    assert config.data.val_files == str(tmp_path / "run" / "data" / "val_files.fit.parquet")
    assert [row_task(row) for row in pq.read_table(kept).to_pylist()] == \
           [task for index, task in enumerate(FIT_TASKS) if index not in (1, 4, 6)]
    assert (tmp_path / "tasks.jsonl").read_bytes() == user_file and pq.read_table(rows_file).num_rows == 8
    assert val.tasks == 8 and len(val.dropped) == 3


def test_no_task_fitting_is_refused_naming_the_numbers_and_the_fix(tmp_path: Path, qwen_dir: Path) -> None:
    config = _config(tmp_path, qwen_dir, "factory", limit=64)
    rows_file = config.data.train_files
    with pytest.raises(ConfigurationError) as caught:
        fit_prompts(config)
    message = str(caught.value)
    assert message.startswith("data.train_files: none of the 8 training tasks fits data.max_prompt_length=64: their "
                              "first prompts (system prompt, tool schemas and task, as the chat template renders "
                              "them) have ")
    longest = int(message.split(" tokens;")[0].rsplit(" ", 1)[1])
    assert longest > 64 + 600  # the long questions' prompts
    assert f"raise data.max_prompt_length to at least {longest}, or shorten the system prompt, tools or tasks" \
           in message
    assert config.data.train_files == rows_file and not list((tmp_path / "run" / "data").glob("*.fit.parquet"))


def test_the_rollouts_own_prompt_length_is_the_limit_when_set_apart(tmp_path: Path, qwen_dir: Path,
                                                                    caplog: Any) -> None:
    config = _config(tmp_path, qwen_dir, "factory", FIT_TASKS, 4096, f"actor_rollout_ref.rollout.prompt_length={LIMIT}")
    with caplog.at_level(logging.INFO, logger="rllm.training.verl.prompt_fit"):
        train, _ = fit_prompts(config)
    assert [index for _, index in train.dropped] == [1, 4, 6]
    assert f"longer than actor_rollout_ref.rollout.prompt_length={LIMIT}" in caplog.text


def test_every_task_fitting_keeps_the_files_and_says_so(tmp_path: Path, qwen_dir: Path, caplog: Any) -> None:
    config = _config(tmp_path, qwen_dir, "factory", tasks=TASKS)
    rows_file = config.data.train_files
    with caplog.at_level(logging.INFO, logger="rllm.training.verl.prompt_fit"):
        train, _ = fit_prompts(config)
    assert train.dropped == [] and config.data.train_files == rows_file
    assert f"data.train_files: every one of the 4 training tasks fits data.max_prompt_length={LIMIT} (the longest " \
           f"first prompt has {train.longest} tokens" in caplog.text


def test_the_launch_checks_train_on_the_kept_tasks(tmp_path: Path, qwen_dir: Path, caplog: Any) -> None:
    """What ``--dry-run`` runs (verl's validation, then the launch checks): the fit, then the sizing of what it kept."""
    with pytest.raises(ConfigurationError, match="^5 training task\\(s\\), fewer than data.train_batch_size=64"):
        validate(_config(tmp_path / "a", qwen_dir, "factory"))  # 8 tasks given, 5 fit
    config = _config(tmp_path / "b", qwen_dir, "factory", FIT_TASKS, LIMIT, "data.train_batch_size=4",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4")
    with caplog.at_level(logging.INFO):
        checked = validate(config)
    assert "data.train_files: 3 of 8 training tasks dropped" in caplog.text
    assert config.data.train_files.endswith("train_files.fit.parquet")
    assert checked.task == FIT_TASKS[0]


def test_a_tokenizer_not_on_this_machine_measures_nothing_and_says_so(tmp_path: Path, caplog: Any) -> None:
    config = _config(tmp_path, "Qwen/Qwen3-4B", "factory")  # a hub name, not cached here: no download is tried
    rows_file = config.data.train_files
    with caplog.at_level(logging.INFO, logger="rllm.training.verl.prompt_fit"):
        assert fit_prompts(config) == []
    assert "the first prompts of the tasks were not measured against data.max_prompt_length: the tokenizer of " \
           "actor_rollout_ref.model.path=Qwen/Qwen3-4B is not on this machine" in caplog.text
    assert config.data.train_files == rows_file
