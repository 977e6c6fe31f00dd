"""The compact record of a rollout's conversation and where a run keeps its steps' rollouts.

One format serves the writer (the training loop's rollout records, ``rllm.training.verl.trainer.rollout_records``)
and the reader (``rllm.viewer``), so a page shows what training kept, and an evaluation's episodes
(``Episode`` JSON) through the same conversation view. A conversation is the list of what happened in
order, each entry a dict with a ``kind``:

* ``message``: a message the model was sent that the previous call had not seen (the system prompt, the
  task, tool results, a new user turn), as OpenAI-format ``message``;
* ``output``: what a model call answered: ``text``, ``reasoning``, ``tool_calls`` (``name``, ``arguments``
  as the model wrote them, ``error`` when they did not parse), ``finish_reason``;
* ``side_call``: a call on the agent's model outside its turns (a context manager's summary): its last
  request message and its ``output``;
* ``rewritten``: the next call's history is not an extension of the previous one (a conversation manager
  rewrote it); its messages follow in full.

Only what is new per call is kept, so a rollout of n turns holds its messages once, not n times.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ROLLOUTS_DIR = "rollouts"
"""The folder of a run directory that holds one JSONL of rollout records per recorded step."""


CONVERSATION_FIELD = "rllm_conversation"
"""The ``extra_fields`` key under which verl's agent loop hands the trainer a rollout's task and conversation (JSON,
on its last sample; ``""`` on the others and when the run keeps no records)."""


def step_file_name(step: int) -> str:
    """The file of step ``step``'s rollout records in ``ROLLOUTS_DIR`` (``step_000012.jsonl``)."""
    return f"step_{int(step):06d}.jsonl"


def _get(item: Any, name: str, default: Any = None) -> Any:
    if isinstance(item, dict):
        return item.get(name, default)
    return getattr(item, name, default)


def _output(model_output: Any, stop_reason: Any) -> dict[str, Any]:
    calls = [{"name": _get(call, "name"), "arguments": _get(call, "arguments"),
              **({"error": _get(call, "error")} if _get(call, "error") else {})}
             for call in _get(model_output, "tool_calls", None) or []]
    return {"kind": "output", "text": _get(model_output, "text", "") or "",
            "reasoning": _get(model_output, "reasoning"), "tool_calls": calls,
            "finish_reason": _get(model_output, "finish_reason") or stop_reason}


def conversation(steps: Iterable[Any]) -> list[dict[str, Any]]:
    """The conversation of one trajectory's steps (``Step`` records or their JSON), in the compact form above."""
    entries: list[dict[str, Any]] = []
    previous: list[dict[str, Any]] | None = None
    last: Any = None
    for step in steps:
        messages = list(_get(step, "messages", None) or [])
        info = _get(step, "info", None) or {}
        output = _output(_get(step, "model_output", {}), _get(step, "stop_reason"))
        if info.get("side_call"):
            entries.append({"kind": "side_call", "request": messages[-1:], "output": output})
            continue
        seen = 0 if previous is None else len(previous) + 1  # the previous call's messages and its answer
        if previous is not None and (len(messages) < seen or messages[:len(previous)] != previous):
            entries.append({"kind": "rewritten", "messages": len(messages)})
            seen = 0
        entries.extend({"kind": "message", "message": message} for message in messages[seen:])
        entries.append(output)
        previous, last = messages, step
    if last is not None:  # tool results after the last call (a budget or a hook ended the run there)
        entries.extend({"kind": "message", "message": message} for message in _get(last, "observation", None) or [])
    return entries


def number_call_ids(conversations: Iterable[list[dict[str, Any]]]) -> None:
    """Replace the tool-call ids in ``conversations`` (one rollout's) by ``call_1``, ``call_2``, ... in order, in place.

    The parser invents a random id per call (the model writes none in the Hermes format), so the same rollout
    run twice would record differently; numbered in order, calls and their results still pair up.
    """
    numbers: dict[str, str] = {}

    def number(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        return numbers.setdefault(value, f"call_{len(numbers) + 1}")

    for entries in conversations:
        for entry in entries:
            message = entry.get("message") if entry.get("kind") == "message" else None
            if not isinstance(message, dict):
                continue
            if "tool_call_id" in message:
                message["tool_call_id"] = number(message["tool_call_id"])
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and "id" in call:
                    call["id"] = number(call["id"])


def content_text(content: Any) -> str:
    """The text of an OpenAI-format message's content (a string, or a list of parts with ``text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def task_text(task: Any) -> str:
    """What a page shows as a task: its ``question``, ``prompt`` or ``problem``, a prompt's user text, or its JSON."""
    import json

    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        for key in ("question", "prompt", "problem", "task"):
            if isinstance(task.get(key), str):
                return str(task[key])
        raw = task.get("raw_prompt")
        if isinstance(raw, list):
            users = [content_text(m.get("content")) for m in raw if isinstance(m, dict) and m.get("role") == "user"]
            if users:
                return users[0]
    if isinstance(task, list):
        users = [content_text(m.get("content")) for m in task if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return users[0]
    return json.dumps(task, default=str) if task is not None else ""
