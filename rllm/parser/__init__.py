"""Strict parsers that turn raw completion text into content, reasoning and tool calls."""

from rllm.parser.tool_parsers import (
    CallIdFactory,
    HermesToolParser,
    ParsedOutput,
    Qwen3CoderToolParser,
    ToolCallParser,
    get_tool_parser,
)

__all__ = [
    "CallIdFactory",
    "HermesToolParser",
    "ParsedOutput",
    "Qwen3CoderToolParser",
    "ToolCallParser",
    "get_tool_parser",
]
