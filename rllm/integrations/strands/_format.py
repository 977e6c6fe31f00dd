"""Strands messages and tool specs to OpenAI chat format, and a ``ModelOutput`` back to Strands events.

The conversion reuses Strands' own ``OpenAIModel`` classmethods, so assistant ``toolUse`` blocks
become ``tool_calls`` and every ``toolResult`` a ``tool`` message with its ``tool_call_id`` and all
of its text and json blocks. Two things the stock converter drops are added back: reasoning
content (as ``reasoning_content``, which chat templates of reasoning models read) and the error
status of a tool result (an error result that does not already say so is prefixed ``Error: ``).
A system prompt given as content blocks becomes one system message, its text blocks joined as
Strands joins them (``split_system_prompt``): the stock converter sends one system message per
block, which templates render as several system turns or refuse.
"""

from __future__ import annotations

from typing import Any

from strands.models.openai import OpenAIModel
from strands.types.content import Message, Messages, SystemContentBlock, split_system_prompt
from strands.types.streaming import StopReason, StreamEvent
from strands.types.tools import ToolChoice, ToolSpec

from rllm.types import ModelOutput

_ERROR_PREFIX = "Error: "
# Name given to a tool call whose name could not be parsed, so Strands still answers it (with an error).
INVALID_TOOL_NAME = "invalid_tool_call"


def _reasoning_text(message: Message) -> str:
    return "".join(
        block["reasoningContent"].get("reasoningText", {}).get("text", "")
        for block in message["content"]
        if "reasoningContent" in block
    )


def _mark_error(content: Any) -> Any:
    """Make a failed tool result say so in its first text, keeping every block."""
    if isinstance(content, str):
        return content if content.lower().startswith("error") else _ERROR_PREFIX + content
    if isinstance(content, list):
        for part in content:
            if part.get("type") == "text":
                part["text"] = _mark_error(part["text"])
                return content
        return [{"type": "text", "text": _ERROR_PREFIX.strip()}, *content]
    return content


def format_messages(
    messages: Messages,
    system_prompt: str | None = None,
    system_prompt_content: list[SystemContentBlock] | None = None,
) -> list[dict[str, Any]]:
    """OpenAI chat messages for a Strands history: one system message first, nothing flattened."""
    if system_prompt_content is not None:  # the authoritative form; cache points carry no text
        system_prompt = split_system_prompt(system_prompt_content)[0]
    formatted = OpenAIModel.format_request_messages([], system_prompt)
    for message in messages:
        blocks = message["content"]
        plain: Message = {"role": message["role"], "content": [b for b in blocks if "reasoningContent" not in b]}
        # Formatting one message at a time lets the reasoning and error status be attached to the
        # messages it produced without re-deriving Strands' conversion.
        chunk = OpenAIModel.format_request_messages([plain])
        reasoning = _reasoning_text(message)
        if reasoning and message["role"] == "assistant":
            assistant = next((m for m in chunk if m["role"] == "assistant"), None)
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                chunk.append(assistant)
            assistant["reasoning_content"] = reasoning
        failed = {
            b["toolResult"]["toolUseId"]
            for b in blocks
            if "toolResult" in b and b["toolResult"].get("status") == "error"
        }
        for entry in chunk:
            if entry["role"] == "tool" and entry["tool_call_id"] in failed:
                entry["content"] = _mark_error(entry["content"])
        formatted.extend(chunk)
    return formatted


def format_tools(tool_specs: list[ToolSpec] | None) -> list[dict[str, Any]]:
    """OpenAI function tools, descriptions included."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec.get("description", ""),
                "parameters": spec["inputSchema"]["json"],
            },
        }
        for spec in tool_specs or []
    ]


def format_tool_choice(tool_choice: ToolChoice | None) -> Any:
    """The OpenAI ``tool_choice`` for a Strands one, or ``None`` to leave it to the server."""
    return OpenAIModel._format_request_tool_choice(tool_choice).get("tool_choice")


def stop_reason(output: ModelOutput) -> StopReason:
    """Strands' stop reason for an OpenAI finish reason."""
    if output.finish_reason == "length":
        return "max_tokens"
    if output.finish_reason == "content_filter":
        return "content_filtered"
    if output.tool_calls:
        return "tool_use"
    return "end_turn"


def output_events(output: ModelOutput, latency_ms: int = 0) -> list[StreamEvent]:
    """The Strands event sequence for one model turn: start, content blocks, stop, usage."""
    events: list[StreamEvent] = [{"messageStart": {"role": "assistant"}}]
    if output.reasoning:
        events += [
            {"contentBlockStart": {"start": {}}},
            {"contentBlockDelta": {"delta": {"reasoningContent": {"text": output.reasoning}}}},
            {"contentBlockStop": {}},
        ]
    if output.text:
        events += [
            {"contentBlockStart": {"start": {}}},
            {"contentBlockDelta": {"delta": {"text": output.text}}},
            {"contentBlockStop": {}},
        ]
    for call in output.tool_calls:
        events += [
            {"contentBlockStart": {"start": {"toolUse": {"name": call.name or INVALID_TOOL_NAME,
                                                         "toolUseId": call.id}}}},
            {"contentBlockDelta": {"delta": {"toolUse": {"input": call.arguments}}}},
            {"contentBlockStop": {}},
        ]
    events.append({"messageStop": {"stopReason": stop_reason(output)}})
    usage = output.usage
    events.append(
        {
            "metadata": {
                "usage": {
                    "inputTokens": usage.get("prompt_tokens", 0),
                    "outputTokens": usage.get("completion_tokens", 0),
                    "totalTokens": usage.get("total_tokens", 0),
                },
                "metrics": {"latencyMs": latency_ms},
            }
        }
    )
    return events
