r"""The two-hop lookup agent: a task no policy can solve without calling its tool twice.

A ``LookupWorld`` maps boxes to items and items to codes, all random: ``"box 3757"`` →
``"item 5821"``, ``"item 5821"`` → ``"code 9304"``. The question "What is the code of the item in
box 3757?" is answered by looking up the box, then the item, then writing ``\boxed{9304}``; a
policy that skips a lookup can only guess one code in 9,000. The agent is a plain Strands agent
with one ``@tool``, ``lookup(key)``, so its rollouts run through the same runner as the search
agent's. ``demonstration_script`` answers as a (deliberately imperfect) teacher would, for a warm
start rendered by the same token path as the rollouts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from strands import tool

from rllm.data.verl_rows import AGENT_NAME, scoring_task, verl_row
from rllm.integrations.strands import Budget
from rllm.rewards.base import RewardOutput

LOOKUP_SYSTEM_PROMPT = "Use the lookup tool. Answer with the code in \\boxed{}."
LOOKUP_BUDGET = Budget(max_model_turns=4, max_tool_calls=4)
"""Two lookups and the answer need three model calls; one call of slack."""
DATA_SOURCE = "lookup"
"""The verl rows' ``data_source`` (verl logs validation metrics under it: ``val-core/lookup/...``)."""

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class LookupTask:
    """One question: the box asked about, the item in it and the item's code."""

    box: int
    item: int
    code: int

    @property
    def task_id(self) -> str:
        return f"box-{self.box}"

    @property
    def question(self) -> str:
        return f"What is the code of the item in box {self.box}?"


class LookupWorld:
    """``size`` boxes, each holding a distinct random item with a random four-digit code.

    Args:
        size: Boxes; boxes and items are distinct random four-digit numbers, so at most 9,000. Boxes
            numbered 1..size made a held-out split of the last boxes (953-1000 of 1000) a test of copying
            digit patterns no training question has ("box 986" was looked up as "box 966"), not of tool use.
        seed: Draws the items and codes.
    """

    def __init__(self, size: int = 1000, seed: int = 0) -> None:
        if not 1 <= size <= 9000:
            raise ValueError(f"a LookupWorld holds 1 to 9,000 boxes, not {size}")
        rng = random.Random(seed)
        boxes = rng.sample(range(1000, 10000), size)
        items = rng.sample(range(1000, 10000), size)
        self.tasks = [LookupTask(box=box, item=item, code=rng.randrange(1000, 10000))
                      for box, item in zip(boxes, items, strict=True)]
        self._table = {f"box {t.box}": f"item {t.item}" for t in self.tasks}
        self._table.update({f"item {t.item}": f"code {t.code}" for t in self.tasks})

    def lookup(self, key: str) -> str:
        """What the world holds under ``key`` (``"box N"`` or ``"item N"``), or a not-found notice."""
        key = " ".join(key.strip().lower().split())
        return self._table.get(key, f"nothing is stored under '{key}'")

    def split(self, held_out: int) -> tuple[list[LookupTask], list[LookupTask]]:
        """The tasks as (training, held-out), the last ``held_out`` boxes held out."""
        if not 0 < held_out < len(self.tasks):
            raise ValueError(f"held_out must be between 1 and {len(self.tasks) - 1}")
        return self.tasks[:-held_out], self.tasks[-held_out:]


def lookup_tools(world: LookupWorld) -> list[Any]:
    """The agent's tools: ``lookup`` bound to ``world``."""

    @tool
    def lookup(key: str) -> str:
        """Look up a key such as "box 12" or "item 3456"."""
        return world.lookup(key)

    return [lookup]


def lookup_world_tools(world_size: int = 1000, seed: int = 0) -> list[Any]:
    """``lookup_tools`` over ``LookupWorld(world_size, seed)``: plain arguments, for a recipe's ``tool_factory``.

    The world is rebuilt from its seed, so every rollout worker holds the same boxes as the rows.
    """
    return lookup_tools(LookupWorld(world_size, seed=seed))


def _boxed_code(answer: str | None) -> str | None:
    r"""What the last ``\boxed{}`` of ``answer`` holds (stripped), or ``None`` without one."""
    found = _BOXED.findall(answer or "")
    return found[-1].strip() if found else None


def score_lookup_answer(answer: str, task: LookupTask) -> float:
    r"""1.0 when the last ``\boxed{}`` of ``answer`` holds the task's code, else 0.0."""
    return 1.0 if _boxed_code(answer) == str(task.code) else 0.0


def score_lookup_row(task: dict[str, Any], final_answer: str) -> dict[str, float]:
    r"""The numbers of one final answer (``lookup_row_reward`` hands them to verl).

    ``task["answer"]`` is the row's ground truth, the code; returns ``score`` (1.0 when the last
    ``\boxed{}`` holds it, as ``score_lookup_answer``) and ``boxed`` (an answer was found).
    """
    boxed = _boxed_code(final_answer)
    return {"score": 1.0 if boxed is not None and boxed == str(task["answer"]).strip() else 0.0,
            "boxed": float(boxed is not None)}


def lookup_task_rows(tasks: Iterable[LookupTask]) -> list[dict[str, Any]]:
    """``tasks`` as the task dicts ``AgentWorkflowEngine`` runs: id, question, the code as answer, the box."""
    return [{"id": t.task_id, "question": t.question, "answer": str(t.code), "box": t.box} for t in tasks]


def lookup_reward(task: dict[str, Any], final_answer: str) -> RewardOutput:
    r"""The lookup reward for ``StrandsWorkflow``: 1.0 when the last ``\boxed{}`` holds ``task["answer"]``."""
    scores = score_lookup_row(task, final_answer)
    return RewardOutput(reward=scores["score"], is_correct=scores["score"] == 1.0,
                        metadata={"boxed": _boxed_code(final_answer), "answer": task["answer"]})


def lookup_row_reward(task: dict[str, Any], final_answer: str) -> RewardOutput:
    r"""The ``lookup_rloo`` recipe's ``rllm.reward_fn``: 1.0 when the last ``\boxed{}`` holds the item's code.

    ``task`` is a lookup task or the verl row the loop hands over (``scoring_task``); the reward's
    metadata holds ``boxed`` (an answer was found, 0 or 1), which verl logs beside ``score``.
    """
    scores = score_lookup_row(scoring_task(task), final_answer)
    return RewardOutput(reward=scores["score"], is_correct=scores["score"] == 1.0, metadata={"boxed": scores["boxed"]})


def lookup_verl_rows(tasks: Iterable[LookupTask], split: str, *, agent_name: str = AGENT_NAME) -> list[dict[str, Any]]:
    """Verl rows for lookup ``tasks``: the agent's system prompt, the question, the code as ground truth."""
    return [
        verl_row(index=index, split=split, system_prompt=LOOKUP_SYSTEM_PROMPT, question=task.question,
                 data_source=DATA_SOURCE, ground_truth=str(task.code), agent_name=agent_name,
                 extra_info={"id": task.task_id, "box": task.box})
        for index, task in enumerate(tasks)
    ]


DEMONSTRATION_KINDS = ("two_hops", "one_hop", "no_tool")


def demonstration_script(
    task: LookupTask, kind: str, rng: random.Random,
) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """A teacher for ``MessageScriptedEngine``: answers ``task`` as ``kind`` says.

    ``two_hops`` looks up the box, then the item, and answers with the code; ``one_hop`` looks
    up the box and answers with the item's number (stopping one lookup early, a common mistake);
    ``no_tool`` guesses a random four-digit code at once. Only ``two_hops`` earns the reward.
    """
    if kind not in DEMONSTRATION_KINDS:
        raise ValueError(f"unknown demonstration kind {kind!r}; one of {DEMONSTRATION_KINDS}")
    guess = rng.randrange(1000, 10000)
    keys = {"two_hops": [f"box {task.box}", f"item {task.item}"], "one_hop": [f"box {task.box}"], "no_tool": []}[kind]
    answer = {"two_hops": task.code, "one_hop": task.item, "no_tool": guess}[kind]

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        done = sum(1 for m in messages if m.get("role") == "tool")
        if done < len(keys):
            call = {"id": f"call_{done}", "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"key": "{keys[done]}"}}'}}
            return {"content": "", "tool_calls": [call]}
        return {"content": f"\\boxed{{{answer}}}"}

    return script
