"""What a run needs from the user's code and data, tried once before Ray starts (the launcher; ``--dry-run`` too).

A misspelled factory, a reward that returns the wrong type or a task file without the fields the
prompt needs would otherwise surface minutes into a run, once Ray and verl's workers are up. So
the launcher reads the ``rllm`` block (every key known), imports what it names, reads the first
training row, builds the agent for it exactly as a rollout worker will (the factory called on the
task, with a model that refuses to generate), scores an empty answer with the reward, and finds the
retrieval servers the agent's tools search. Each failure names the key (a ``ConfigurationError``, as
``rllm.training.verl.settings`` raises for the block's own values).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rllm.errors import ConfigurationError
from rllm.integrations.strands import Budget, RLLMModel
from rllm.integrations.strands.rollout import built_agents
from rllm.integrations.strands.teams import record_built
from rllm.integrations.strands.traced import check_factory_built
from rllm.rewards.base import score_answer
from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV
from rllm.training.verl._dotted import import_object
from rllm.training.verl.agent_loop import (
    SETTINGS_KEY,
    LoopSettings,
    build_tools,
    factory_refusal,
    loop_settings,
    row_task_or_row,
    split_prompt,
)
from rllm.training.verl.settings import BLOCK_KEY, REWARD_KEY, RllmSettings, read_settings
from rllm.types import ModelOutput

logger = logging.getLogger(__name__)

RLLM_KEYS = tuple(spec.name for spec in dataclasses.fields(RllmSettings))
"""The keys of the recipe's ``rllm`` block (``rllm.training.verl.settings``); any other is refused."""
SCORER_KEY = "reward.custom_reward_function.reward_kwargs.scorer"
RLLM_REWARD_PATH = "pkg://rllm.training.verl.reward"


@dataclass
class Preflight:
    """What the launcher learned from the user's code before starting anything.

    Attributes:
        settings: The agent loop's settings, as every rollout worker reads them.
        task: The first training task, as the factory and the reward get it.
        tool_names: The tools of the agent built for it.
        retrieval: ``(base_url, token)`` of each retrieval server its tools search (checked before a real run).
    """

    settings: LoopSettings
    task: dict[str, Any]
    tool_names: list[str] = field(default_factory=list)
    retrieval: list[tuple[str, str | None]] = field(default_factory=list)


class _NoGeneration:
    """The engine behind the preflight's model: building an agent must not call the model."""

    async def get_model_response(self, messages: list[dict[str, Any]], tools: Any = None,
                                 **sampling: Any) -> ModelOutput:
        raise ConfigurationError("the agent factory called the model while building the agent (before training "
                                 "started); build the agent only, the rollout runs it")


def check_rllm_block(config: Any) -> None:
    """Refuse a recipe without the ``rllm`` block, or a value of it that ``read_settings`` refuses."""
    if OmegaConf.select(config, BLOCK_KEY, default=None) is None:
        raise ConfigurationError(f"the recipe has no rllm block ({', '.join(RLLM_KEYS)}); start from "
                                 "strands_agent_rloo.yaml")
    read_settings(config)


def first_row(config: Any) -> dict[str, Any]:
    """The first row of the first training file (verl rows: the launcher has written any task file as rows)."""
    files = OmegaConf.select(config, "data.train_files", default=None)
    if not files:
        raise ConfigurationError("data.train_files is not set: name your task files (.json, .jsonl or .parquet)")
    path = Path(files if isinstance(files, str) else files[0])
    if not path.is_file():
        raise ConfigurationError(f"data.train_files: no file {path}")
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1):
        rows = batch.to_pylist()
        if rows:
            return rows[0]
    raise ConfigurationError(f"data.train_files: {path} has no rows")


def _import(key: str, path: str) -> Any:
    try:
        return import_object(path)
    except (ImportError, ConfigurationError) as error:
        raise ConfigurationError(f"{key}={path}: {error}") from None


@contextlib.contextmanager
def _policy_placeholder(own_client: bool) -> Iterator[None]:
    """With ``own_client``, a policy endpoint for the factory to read (never called: nothing runs here)."""
    if not own_client:
        yield
        return
    values = {BASE_URL_ENV: "http://127.0.0.1:9/v1", API_KEY_ENV: "preflight", MODEL_ENV: "policy"}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def preflight(config: Any) -> Preflight:
    """Try the run's agent, tools and reward on its first training task; ``ConfigurationError`` naming what fails."""
    check_rllm_block(config)
    settings = loop_settings(config)  # its own errors name the key (ConfigurationError)
    _check_reward_source(config, settings)
    row = first_row(config)
    # As verl's worker passes a row to the loop: its prompt as raw_prompt, in the first session of its group.
    task = row_task_or_row({**row, "raw_prompt": row.get("prompt"), "session_id": 0})
    model = RLLMModel(_NoGeneration())
    if settings.agent_factory is not None:
        key = f"{SETTINGS_KEY}.agent_factory"
        factory = _import(key, settings.agent_factory)
        with _policy_placeholder(settings.own_client):
            try:
                built = factory(model, task)
            except ConfigurationError:
                raise
            except Exception as error:
                raise ConfigurationError(f"{key}={settings.agent_factory} raised on the first training task "
                                         f"({type(error).__name__}: {error})") from error
        try:
            record_built(built, budget=settings.budget)
        except TypeError as error:
            raise ConfigurationError(f"{key}={settings.agent_factory}: {error}") from error
        check_factory_built(built, model, own_client=settings.own_client, **factory_refusal(settings))
        tools = [tool for agent in built_agents(built) for tool in agent.tool_registry.registry.values()]
    else:
        assert settings.tool_factory is not None
        _import(f"{SETTINGS_KEY}.tool_factory", settings.tool_factory)
        try:
            tools = build_tools(settings.tool_factory, settings.tool_kwargs)
        except Exception as error:
            raise ConfigurationError(f"{SETTINGS_KEY}.tool_factory={settings.tool_factory} raised "
                                     f"({type(error).__name__}: {error})") from error
        system, _ = split_prompt(row["prompt"])
        if system is None and settings.system_prompt is None:
            raise ConfigurationError(f"the training rows carry no system message and {SETTINGS_KEY}.system_prompt "
                                     "is null: the agent built from tool_factory would have no instructions")
    if settings.reward_fn is not None:
        reward_fn = _import(REWARD_KEY, settings.reward_fn)
        try:
            asyncio.run(score_answer(reward_fn, task, ""))
        except ConfigurationError as error:
            raise ConfigurationError(f"{REWARD_KEY}={settings.reward_fn}: {error}") from error
        except Exception as error:
            raise ConfigurationError(f"{REWARD_KEY}={settings.reward_fn} raised on the first training task with an "
                                     f"empty answer ({type(error).__name__}: {error}); a rollout that answers "
                                     "nothing is scored the same way") from error
    names = [str(getattr(tool, "tool_name", getattr(tool, "name", type(tool).__name__))) for tool in tools]
    retrieval = _retrieval_servers(tools)
    _log_budget(config, settings.budget)
    return Preflight(settings=settings, task=task, tool_names=names, retrieval=retrieval)


def _check_reward_source(config: Any, settings: LoopSettings) -> None:
    if OmegaConf.select(config, "reward.custom_reward_function.path", default=None) != RLLM_REWARD_PATH:
        return  # another reward function entirely: the recipe's business
    scorer = OmegaConf.select(config, SCORER_KEY, default=None)
    if settings.reward_fn is not None and scorer:
        raise ConfigurationError(f"{REWARD_KEY} and {SCORER_KEY} are both set; one reward scores the rollouts: "
                                 f"set {SCORER_KEY}=null to use {REWARD_KEY}")
    if settings.reward_fn is None and not scorer:
        raise ConfigurationError(f"no reward: set {REWARD_KEY} (module:function scoring (task, final_answer), as "
                                 "StrandsWorkflow's reward_fn)")
    if scorer:
        _import(SCORER_KEY, str(scorer))


def _retrieval_servers(tools: list[Any]) -> list[tuple[str, str | None]]:
    """The retrieval servers the tools search (``rag.client.make_local_search_tool`` keeps its client)."""
    from rag.client import RetrievalClient

    servers = []
    for tool in tools:
        client = getattr(tool, "client", None)
        if isinstance(client, RetrievalClient) and (client.base_url, client.token) not in servers:
            servers.append((client.base_url, client.token))
    return servers


def _log_budget(config: Any, budget: Budget) -> None:
    source = OmegaConf.select(config, f"{SETTINGS_KEY}.budget", default=None)
    where = f"{SETTINGS_KEY}.budget={source}" if source is not None else f"{SETTINGS_KEY}.budget unset: the defaults"
    logger.info("each rollout's budget: %s (%s)", budget, where)


def check_retrieval(servers: list[tuple[str, str | None]]) -> None:
    """One authenticated search on each server the agent's tools use; ``ConfigurationError`` saying how to fix it."""
    from rag.client import check_search
    from rag.errors import RetrievalError

    for base_url, token in servers:
        try:
            asyncio.run(check_search(base_url, token))
        except RetrievalError as error:
            raise ConfigurationError(
                f"the agent's local_search cannot search {base_url}: {error}; start the server with "
                "`bash rag/launch_rag.sh` (or set RETRIEVAL_SERVER_URL, and RETRIEVAL_TOKEN if it needs one); "
                "training would drop or fail every rollout") from None
        logger.info("retrieval server OK at %s (an authenticated search)", base_url)
