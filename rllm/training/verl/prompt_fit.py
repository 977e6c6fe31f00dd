"""Every task's first prompt measured before Ray starts: tasks whose prompt cannot fit are dropped from the run.

A row holds the task, not what the rollout's first prompt will be: the system prompt and the tool
schemas come from the agent factory (or ``tool_factory`` and ``system_prompt``), a team adds its own
context, and verl's own length filter (``data.filter_overlong_prompts``) sees only the row. A first
prompt over ``data.max_prompt_length`` (verl's ``rollout.prompt_length``) raises ``PromptTooLongError``
inside a rollout, minutes into the run. So the launcher builds every training and validation task's
agent as a rollout worker does (``StrandsAgentLoop``: the factory called on the task, or the tools
and system prompt, on an ``RLLMModel``; an agent on its own client calls a ``PolicyServer``, as a
worker serves it) and runs it on a token engine that samples nothing (``_FirstPrompts``): every
model call is rendered by ``TokenEngine`` as ``VerlEngine`` renders it, with
the tokenizer of ``actor_rollout_ref.model`` and ``data.apply_chat_template_kwargs``, and answered
with an empty turn. A task's measure is the longest first prompt of the sessions its run opened: the
agent's, or each entry node's of a ``Swarm`` or ``Graph`` (a later node of a graph, run on the empty
answers, has its shortest possible first prompt: one that overflows then overflows in every rollout).
A factory that varies its prompt per call (a date, a sampled example) is measured on one build.

Why drop rather than refuse: a few long tasks among thousands are the data's business, not a
mistake in the recipe, and a rollout could never train on them; the kept rows are written under
``trainer.default_local_dir/data/`` (the user's files are never changed), ``data.train_files`` /
``data.val_files`` point at them, and one log line per split says how many were dropped, the longest
prompt and the limit. When no task of a split fits, nothing could train (or validate): that is a
``ConfigurationError`` naming the numbers and the fix. The measure needs the tokenizer on this
machine (a directory, or the Hugging Face cache): without it the launcher says so and measures nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession
from rllm.errors import ConfigurationError
from rllm.integrations.strands import RLLMModel
from rllm.integrations.strands.runner import AgentChoice, ServedPolicy, build_rollout
from rllm.tracing.policy_server import PolicyServer
from rllm.training.verl._dotted import import_object
from rllm.training.verl.agent_loop import (
    SETTINGS_KEY,
    LoopSettings,
    StrandsAgentLoop,
    agent_choice,
    agent_prompt,
    loop_settings,
    row_task_or_row,
    split_prompt,
    tool_agent_instructions,
)
from rllm.training.verl.preflight import policy_env_restored

logger = logging.getLogger(__name__)

LIMIT_KEY = "data.max_prompt_length"
ROLLOUT_LIMIT_KEY = "actor_rollout_ref.rollout.prompt_length"
"""verl's limit (``data.max_prompt_length`` unless set apart): what ``VerlEngine`` refuses a first prompt over."""
AGENT_NAME = "strands_agent"
"""The name a rollout's agent gets when the agent-loop entry names none (``StrandsAgentLoop``)."""
_SPLITS = (("train_files", "training"), ("val_files", "validation"))


@dataclass(frozen=True)
class SplitFit:
    """What measuring one split's tasks found.

    Attributes:
        key: ``data.train_files`` or ``data.val_files``.
        tasks: Its tasks (rows), over all its files.
        dropped: ``(file, row)`` of every task whose first prompt is over ``limit``.
        longest: The longest first prompt, in tokens (0 when nothing was measured).
        limit: ``data.max_prompt_length``.
        seconds: Wall time of the measure.
        files: The split's files after the fit (the kept rows' files where a file lost rows).
        lengths: Every task's first prompt, in tokens, file by file in row order.
    """

    key: str
    tasks: int
    dropped: list[tuple[str, int]]
    longest: int
    limit: int
    seconds: float
    files: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class _FirstPrompts(TokenEngine):
    """A token engine that samples nothing: it renders each call as every token engine does, and ends the turn.

    The first prompt of each session (a rollout's agent, a team's node) is noted in ``first``;
    every call is answered with the end-of-turn token, so the agent (or team) ends at once.
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any]) -> None:
        # No context limit here: the prompt is measured whatever its length, never refused before _generate.
        super().__init__(tokenizer, context_length=sys.maxsize, chat_template_kwargs=chat_template_kwargs)
        self.first: list[int] = []

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        if len(session.samples) == 1 and session.calls == 1:
            self.first.append(len(prompt_ids))
        return TokenOutput(token_ids=[self.renderer.probe.end_of_turn_id], logprobs=[0.0], finish_reason="stop")


def fit_prompts(config: DictConfig) -> list[SplitFit]:
    """Measure every task's first prompt and drop the tasks over ``data.max_prompt_length``, in place.

    Returns what each split's measure found (nothing when the registry runs no ``StrandsAgentLoop`` or the
    tokenizer is not on this machine, said in the log). An agent on its own client (``own_client``) calls a
    policy server served by the same engine, as a worker serves it.
    ``ConfigurationError`` when no task of a split fits, or building a task's agent fails.
    """
    if not _runs_strands_loop(config):
        return []
    settings = loop_settings(config)
    tokenizer = _tokenizer(config)
    if tokenizer is None:
        return []
    limit_key, limit = _limit(config)
    kwargs = OmegaConf.to_container(OmegaConf.select(config, "data.apply_chat_template_kwargs", default=None)
                                    or OmegaConf.create({}), resolve=True)
    engine = _FirstPrompts(tokenizer, dict(kwargs))  # type: ignore[arg-type]
    measure = _Measure(settings, engine)
    run_dir = Path(config.trainer.default_local_dir)
    fits = []
    for key, split in _SPLITS:
        files = config.data[key]
        if files is None:
            continue
        paths = [str(files)] if isinstance(files, str) else [str(f) for f in files]
        fit = _fit_split(f"data.{key}", split, paths, measure, (limit_key, limit), run_dir)
        if fit is None:
            continue
        with open_dict(config):
            config.data[key] = fit.files[0] if isinstance(files, str) else list(fit.files)
        fits.append(fit)
    return fits


def _limit(config: DictConfig) -> tuple[str, int]:
    """The key and value of the first prompt's limit: ``data.max_prompt_length``, or the rollout's own if it differs."""
    data = int(config.data.max_prompt_length)
    rollout = OmegaConf.select(config, ROLLOUT_LIMIT_KEY, default=None)
    if rollout is not None and int(rollout) != data:
        return ROLLOUT_LIMIT_KEY, int(rollout)
    return LIMIT_KEY, data


def _runs_strands_loop(config: DictConfig) -> bool:
    """Whether the agent-loop registry runs ``StrandsAgentLoop`` (whose prompts this module measures)."""
    path = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    if not path or not Path(path).is_file():
        return False
    target = f"{StrandsAgentLoop.__module__}.{StrandsAgentLoop.__qualname__}"
    entries = OmegaConf.to_container(OmegaConf.load(path))
    return any(isinstance(entry, dict) and entry.get("_target_") == target for entry in entries or [])


def _tokenizer(config: DictConfig) -> Any:
    """The rollout's tokenizer as verl's ``HFModelConfig`` loads it, from this machine only; ``None`` if absent."""
    from verl.utils import hf_tokenizer

    model = config.actor_rollout_ref.model
    path = str(OmegaConf.select(model, "tokenizer_path", default=None) or model.path)
    try:
        tokenizer = hf_tokenizer(path, trust_remote_code=bool(OmegaConf.select(model, "trust_remote_code",
                                                                                default=False)),
                                 local_files_only=True)
    except (OSError, ValueError) as error:
        logger.warning("the first prompts of the tasks were not measured against %s: the tokenizer of "
                       "actor_rollout_ref.model.path=%s is not on this machine (%s: %s); download it first "
                       "(`hf download %s`) to have every task too long for the prompt dropped before the run",
                       LIMIT_KEY, path, type(error).__name__, str(error).splitlines()[0] if str(error) else "", path)
        return None
    template = OmegaConf.select(model, "custom_chat_template", default=None)
    if template is not None:  # as verl's agent-loop worker sets it
        tokenizer.chat_template = template
    return tokenizer


class _Measure:
    """Builds and runs one task's agent as a rollout worker does, on ``_FirstPrompts``; its longest first prompt."""

    def __init__(self, settings: LoopSettings, engine: _FirstPrompts) -> None:
        self.settings = settings
        self.engine = engine
        self.model = RLLMModel(engine)
        self.server: PolicyServer | None = None
        key = "agent_factory" if settings.block.agent_factory is not None else "tool_factory"
        _import(f"{SETTINGS_KEY}.{key}", str(getattr(settings.block, key)))
        self.choice: AgentChoice = agent_choice(settings, name=AGENT_NAME)  # a factory imported, tools built once

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """With ``own_client``, the policy server a worker serves such an agent, exported as it exports it."""
        if not self.settings.block.own_client:
            yield
            return
        with policy_env_restored():
            self.server = await PolicyServer().start()
            self.server.export()
            try:
                yield
            finally:
                await self.server.stop()
                self.server = None

    async def first_prompt(self, row: dict[str, Any], where: str) -> int:
        """The longest first prompt of ``row``'s rollout, in tokens (``where`` names the task in errors)."""
        settings = self.settings
        system, conversation = split_prompt(row["prompt"])
        choice, task = self.choice, None
        if settings.block.agent_factory is None:  # as StrandsAgentLoop builds it
            choice = dataclasses.replace(choice, system_prompt=tool_agent_instructions(settings, system, where))
        else:
            task = row_task_or_row({**row, "raw_prompt": row.get("prompt"), "session_id": 0})
        rollout = build_rollout(choice, self.model, task, where=where)  # with own_client, after the server's export
        before = len(self.engine.first)
        own_client = None if self.server is None else ServedPolicy(self.server, self.engine)
        finished = await rollout.run(agent_prompt(conversation), own_client=own_client)
        measured = self.engine.first[before:]
        if not measured:
            end = finished.end
            raise ConfigurationError(f"{where}: its agent ended before its first model call ({end.reason.value}"
                                     f"{': ' + end.failure if end.failure else ''}); a rollout of it would have "
                                     "nothing to train")
        return max(measured)


def _import(key: str, path: str) -> Any:
    try:
        return import_object(path)
    except (ImportError, ConfigurationError) as error:
        raise ConfigurationError(f"{key}={path}: {error}") from None


def _fit_split(key: str, split: str, paths: list[str], measure: _Measure, limit_of: tuple[str, int],
               run_dir: Path) -> SplitFit | None:
    """Measure a split's rows, write the kept rows of each file that lost some, log the count; refuse none kept."""
    import pyarrow.parquet as pq

    limit_key, limit = limit_of
    started = time.perf_counter()
    tables = []
    for path in paths:
        if not Path(path).is_file():
            return None  # verl says so, with its own message
        tables.append(pq.read_table(path))
    lengths: list[list[int]] = []

    async def _all() -> None:
        async with measure.serving():
            for path, table in zip(paths, tables, strict=True):
                lengths.append([await measure.first_prompt(row, f"{split} task {index} of {path}")
                                for index, row in enumerate(table.to_pylist())])

    asyncio.run(_all())
    dropped = [(path, index) for path, file_lengths in zip(paths, lengths, strict=True)
               for index, length in enumerate(file_lengths) if length > limit]
    tasks = sum(len(file_lengths) for file_lengths in lengths)
    longest = max((length for file_lengths in lengths for length in file_lengths), default=0)
    seconds = time.perf_counter() - started
    if tasks and len(dropped) == tasks:
        raise ConfigurationError(
            f"{key}: none of the {tasks} {split} tasks fits {limit_key}={limit}: their first prompts (system prompt, "
            f"tool schemas and task, as the chat template renders them) have {min(min(x) for x in lengths if x)} to "
            f"{longest} tokens; raise {limit_key} to at least {longest}, or shorten the system prompt, tools or tasks")
    files = []
    for index, (path, table, file_lengths) in enumerate(zip(paths, tables, lengths, strict=True)):
        keep = [row for row, length in enumerate(file_lengths) if length <= limit]
        if len(keep) == len(file_lengths):
            files.append(path)
            continue
        name = key.split(".", 1)[1] + ("" if len(paths) == 1 else f"_{index}")
        out = run_dir / "data" / f"{name}.fit.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.take(keep), out)
        files.append(str(out))
    if dropped:
        logger.warning("%s: %d of %d %s tasks dropped: their first prompt is longer than %s=%d (the longest has %d "
                       "tokens); the %d kept are in %s (measured in %.1f s)", key, len(dropped), tasks, split,
                       limit_key, limit, longest, tasks - len(dropped),
                       ", ".join(f for f, p in zip(files, paths, strict=True) if f != p), seconds)
    else:
        logger.info("%s: every one of the %d %s tasks fits %s=%d (the longest first prompt has %d tokens; measured "
                    "in %.1f s)", key, tasks, split, limit_key, limit, longest, seconds)
    return SplitFit(key=key, tasks=tasks, dropped=dropped, longest=longest, limit=limit, seconds=seconds, files=files,
                    lengths=[length for file_lengths in lengths for length in file_lengths])
