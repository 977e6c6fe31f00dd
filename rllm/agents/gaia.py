"""The GAIA agent: system prompt, a workflow with a fresh work dir per task, and a scripted stand-in policy.

``GaiaWorkflow`` gives every task its own work directory holding a copy of its attachment (its
path is in the prompt) and binds the GAIA tools (calculator, ``http_request``, ``file_read``,
``python_exec``) to it. ``scripted_gaia_policy`` answers for a model in offline runs and tests.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

from rllm.engine.rollout import RolloutEngine
from rllm.integrations.strands import Budget, StrandsAgent
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.rewards.gaia_reward import RewardGaiaFn
from rllm.tokens.renderer import content_text
from rllm.tools import gaia_tools
from rllm.types import Episode
from rllm.workflows import StrandsWorkflow

GAIA_SYSTEM_PROMPT = """\
You are a general AI assistant. You will be given a question; solve it step by step, using your \
tools whenever they help (arithmetic, fetching web pages, reading the task's files, running Python).
Report your reasoning, then finish your answer with a line of this form:
FINAL ANSWER: [YOUR FINAL ANSWER]
YOUR FINAL ANSWER should be a number OR as few words as possible OR a comma separated list of \
numbers and/or strings. For a number, do not write it with commas and do not add units such as \
$ or percent signs unless the question asks for them. For a string, do not use articles or \
abbreviations (e.g. for cities), and write digits in plain text unless the question says \
otherwise. For a comma separated list, apply these rules to each element."""


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:120] or "task"


def format_gaia_prompt(task: dict[str, Any], attachment: Path | None) -> str:
    """The user message: the question, plus where the attachment is when there is one."""
    prompt = task["question"].strip()
    if attachment is not None:
        prompt += (f"\n\nThe task comes with an attached file, `{attachment.name}`, in your working directory "
                   f"({attachment}). Read it with file_read, or process it with python_exec.")
    return prompt


class GaiaWorkflow(StrandsWorkflow):
    """``StrandsWorkflow`` giving every task a fresh work dir with a copy of its attachment.

    The tools are bound to that directory, so each run builds its agent (over the instance's
    stateless ``RLLMModel``) with ``gaia_tools(work_dir)``; nothing carries over between tasks.

    Args:
        rollout_engine: Engine behind the agent.
        work_root: Parent of the per-rollout work dirs (``work_root/<task id>_<rollout>``), kept
            after the run for inspection and replaced when a rollout is run again.
        system_prompt: The agent's system prompt.
        reward_fn: Scorer; GAIA's official rules by default.
        budget: Per-episode limits.
        tool_options: Keyword arguments of ``gaia_tools`` (``python_timeout``, ``include_http``, ...).
        model_kwargs: ``RLLMModel`` config.
        agent_kwargs: Extra ``StrandsAgent`` arguments.
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        *,
        work_root: str | Path,
        system_prompt: str = GAIA_SYSTEM_PROMPT,
        reward_fn: Any = None,
        budget: Budget | None = None,
        tool_options: dict[str, Any] | None = None,
        model_kwargs: dict[str, Any] | None = None,
        agent_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(rollout_engine, agent_factory=self._build_agent, reward_fn=reward_fn or RewardGaiaFn(),
                         budget=budget, model_kwargs=model_kwargs)
        self.work_root = Path(work_root).resolve()
        self.system_prompt = system_prompt
        self.budget = budget
        self.tool_options = dict(tool_options or {})
        self.agent_kwargs = dict(agent_kwargs or {})
        self.work_dir: Path | None = None
        self.task_to_prompt = self._prompt

    def _prompt(self, task: dict[str, Any]) -> str:
        attachment = None
        if task.get("file_path") and self.work_dir is not None:
            attachment = self.work_dir / Path(task["file_path"]).name
        return format_gaia_prompt(task, attachment)

    def _prepare_work_dir(self, task: dict[str, Any], uid: str) -> Path:
        work_dir = self.work_root / _safe_name(uid.replace(":", "_"))
        if work_dir.exists():
            shutil.rmtree(work_dir)
        work_dir.mkdir(parents=True)
        if task.get("file_path"):
            shutil.copy2(task["file_path"], work_dir / Path(task["file_path"]).name)
        return work_dir

    def reset(self) -> None:
        """Forget the previous task's work dir and agent state."""
        super().reset()
        self.work_dir = None

    def _build_agent(self, model: Any, task: dict[str, Any]) -> StrandsAgent:
        """The task's agent: the GAIA tools bound to its work dir (the workflow's agent factory)."""
        assert self.work_dir is not None
        return StrandsAgent(model, tools=gaia_tools(self.work_dir, **self.tool_options),
                            system_prompt=self.system_prompt, budget=self.budget, **self.agent_kwargs)

    async def run(self, task: dict[str, Any], uid: str) -> Episode:
        """Set up the task's work dir, then build, run and score the agent."""
        self.work_dir = await asyncio.to_thread(self._prepare_work_dir, task, uid)
        episode = await super().run(task, uid)
        episode.info["work_dir"] = str(self.work_dir)
        return episode

    def failed_episode(self, task: dict[str, Any], uid: str, reason: Any, error: str | None = None) -> Episode:
        """The partial episode of a failed run, with its work dir."""
        episode = super().failed_episode(task, uid, reason, error)
        if self.work_dir is not None:
            episode.info["work_dir"] = str(self.work_dir)
        return episode


# --------------------------------------------------------------------------- scripted model
_ATTACHMENT = re.compile(r"attached file, `([^`]+)`")
_EXPRESSION = re.compile(r"(?<![\w.])\(?\d[\d,.]*(?:\s*[-+*/^]\s*\(?\d[\d,.]*\)?)+")


def _last_value(tool_output: str) -> str:
    """The last value in a tool's output: the last cell of a table row or the value of a "key: value" line."""
    lines = [line.strip() for line in tool_output.splitlines()]
    lines = [line for line in lines if line and not re.fullmatch(r"[\[\]{}(),]+", line) and not line.startswith("[")]
    if not lines:
        return ""
    line = lines[-1]
    if " | " in line:
        line = line.rsplit(" | ", 1)[1]
    elif ":" in line:
        line = line.split(":", 1)[1]
    return line.strip().strip('",').strip()


def scripted_gaia_policy(body: dict[str, Any]) -> ScriptedReply:
    """A stand-in model for offline runs: it uses the tools, then answers with the last value it saw.

    First turn: open the attachment with file_read, or hand an arithmetic expression in the question
    to the calculator, or give up. After reading a ``.py`` attachment it runs it with python_exec.
    Then it answers ``FINAL ANSWER: <last value of the last tool output>``. On the fixture this gets
    some tasks right and some wrong, which is what a demo of the scoring needs.
    """
    messages = body["messages"]
    question = content_text(next(m["content"] for m in messages if m["role"] == "user"))
    calls = [c["function"]["name"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    attachment = _ATTACHMENT.search(question)
    if not calls:
        if attachment:
            return ScriptedReply(content="I will read the attached file first.",
                                 tool_calls=[ScriptedToolCall("file_read", json.dumps({"path": attachment.group(1)}))])
        expression = _EXPRESSION.search(question)
        if expression:
            cleaned = expression.group(0).replace(",", "")
            return ScriptedReply(content="This needs arithmetic.",
                                 tool_calls=[ScriptedToolCall("calculator", json.dumps({"expression": cleaned}))])
        return ScriptedReply(content="I cannot work this out with my tools.\nFINAL ANSWER: unknown")
    if calls[-1] == "file_read" and attachment and attachment.group(1).endswith(".py"):
        code = f"import runpy\nrunpy.run_path({attachment.group(1)!r}, run_name='__main__')"
        return ScriptedReply(content="Let me run the program.",
                             tool_calls=[ScriptedToolCall("python_exec", json.dumps({"code": code}))])
    last_output = content_text(next(m["content"] for m in reversed(messages) if m["role"] == "tool"))
    answer = _last_value(last_output)
    return ScriptedReply(content=f"Based on the tool output, the answer is clear.\nFINAL ANSWER: {answer}")
