"""Strict parsers from a model's raw completion text to content, reasoning and tool calls.

Token-in/token-out rollouts decode the completion with special tokens kept as text, so the
rollout itself must recover what the model wrote. Nothing here repairs malformed output: a
broken call becomes a ``ToolCall`` with ``error`` set, so the model is shown (and trained on)
its own mistake instead of a silently fixed call.

Think blocks (``<think>...</think>``) are reasoning and are never searched for tool calls; a
``</think>`` with no ``<think>`` before it is left in the content unless the caller says the
prompt pre-opened the think block (``think_prefilled=True``).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from rllm.errors import DeclaredTypeError, DuplicateKeyError
from rllm.parser.values import ToolSchemas, loads_strict, read_declared
from rllm.types import ToolCall

logger = logging.getLogger(__name__)

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>")
_FUNCTION_OPEN = re.compile(r"<function=([^>\s]+)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER = re.compile(r"\s*<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


@dataclass
class ParsedOutput:
    """What one completion said: visible content, reasoning, tool calls and one error per bad call."""

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    """Turns raw completion text into a ``ParsedOutput``."""

    def parse(
        self,
        text: str,
        *,
        think_prefilled: bool = False,
        ids: Callable[[], str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ParsedOutput: ...


class CallIdFactory:
    """Mints call ids ``call_<8 hex>_<n>``: the hex is random per factory, ``n`` counts up from 0.

    ``n`` is zero-padded to six digits, so ids sort as strings in the order the calls were made
    (for a factory's first million calls). Tool results are paired with calls by id, so one
    episode should share one factory across all its turns; then ids never repeat within the
    episode's chat history.
    """

    def __init__(self, prefix: str = "call") -> None:
        self._stem = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._stem}_{next(self._counter):06d}"


class _MalformedCall(Exception):
    """A tool-call block that breaks the format; ``name`` is the tool name when it could be read."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


def _strip_end_of_turn(text: str) -> str:
    """Drop trailing end-of-turn markers (and whitespace around them) from the completion."""
    text = text.rstrip()
    while True:
        marker = next((m for m in _END_OF_TURN if text.endswith(m)), None)
        if marker is None:
            return text
        text = text[: -len(marker)].rstrip()


def _split_think(text: str, think_prefilled: bool) -> tuple[list[str], str | None]:
    """Split text into the segments outside think blocks and the joined reasoning.

    An unclosed ``<think>`` makes the rest of the text reasoning. Reasoning is ``None`` when
    there is no think block at all, else the stripped inner text (``""`` for an empty block).
    """
    segments: list[str] = []
    thoughts: list[str] = []
    rest = text
    if think_prefilled:
        end = rest.find(_THINK_CLOSE)
        if end < 0:
            return [], rest.strip()
        thoughts.append(rest[:end])
        rest = rest[end + len(_THINK_CLOSE) :]
    while (start := rest.find(_THINK_OPEN)) >= 0:
        segments.append(rest[:start])
        end = rest.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end < 0:
            thoughts.append(rest[start + len(_THINK_OPEN) :])
            rest = ""
            break
        thoughts.append(rest[start + len(_THINK_OPEN) : end])
        rest = rest[end + len(_THINK_CLOSE) :]
    segments.append(rest)
    reasoning = "\n\n".join(t.strip() for t in thoughts if t.strip()) if thoughts else None
    return segments, reasoning


class _TaggedToolParser:
    """Shared scan for formats that wrap each call in ``<tool_call>...</tool_call>``.

    ``ids`` (here or per ``parse``) mints call ids; the default is a fresh ``CallIdFactory`` per
    parser, unique for the parser's life. An episode should pass its own factory so ids never
    repeat across turns even when parsers are recreated.
    """

    def __init__(self, ids: Callable[[], str] | None = None) -> None:
        self._ids: Callable[[], str] = ids if ids is not None else CallIdFactory()

    def parse(
        self,
        text: str,
        *,
        think_prefilled: bool = False,
        ids: Callable[[], str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ParsedOutput:
        """Parse one completion.

        ``think_prefilled`` means the prompt already opened ``<think>``; ``tools`` are the
        request's tools (OpenAI format), whose declared parameter types formats with untyped
        values (Qwen3-Coder) read their arguments by.
        """
        new_id = ids if ids is not None else self._ids
        schemas = ToolSchemas(tools)
        segments, reasoning = _split_think(_strip_end_of_turn(text), think_prefilled)
        output = ParsedOutput(content="", reasoning=reasoning)
        pieces: list[str] = []
        for segment in segments:
            pieces.extend(self._scan_calls(segment, new_id, schemas, output))
        output.content = "".join(pieces).strip()
        return output

    def _scan_calls(self, segment: str, new_id: Callable[[], str], schemas: ToolSchemas,
                    output: ParsedOutput) -> list[str]:
        """Append the segment's calls to ``output`` and return the text around them."""
        pieces: list[str] = []
        pos = 0
        while (start := segment.find(_CALL_OPEN, pos)) >= 0:
            pieces.append(segment[pos:start])
            body_start = start + len(_CALL_OPEN)
            end = segment.find(_CALL_CLOSE, body_start)
            pos = len(segment) if end < 0 else end + len(_CALL_CLOSE)
            body = segment[body_start:] if end < 0 else segment[body_start:end]
            call = self._make_call(new_id(), segment[start:pos], body, schemas, closed=end >= 0)
            output.tool_calls.append(call)
            if call.error is not None:
                output.errors.append(f"tool call {call.id}: {call.error}")
        pieces.append(segment[pos:])
        return pieces

    def _make_call(self, call_id: str, block: str, body: str, schemas: ToolSchemas, *, closed: bool) -> ToolCall:
        """Build one call, or an errored call holding the raw block when the body is malformed."""
        try:
            name, arguments, parsed = self._parse_body(body, schemas)
            if not closed:
                raise _MalformedCall("unclosed", name)
        except _MalformedCall as bad:
            error = str(bad) if closed else f"unclosed {_CALL_OPEN}: no {_CALL_CLOSE} follows"
            logger.debug("malformed tool call %s: %s", call_id, error)
            return ToolCall(id=call_id, name=bad.name, arguments=block, input=None, error=error)
        return ToolCall(id=call_id, name=name, arguments=arguments, input=parsed)

    def _parse_body(self, body: str, schemas: ToolSchemas) -> tuple[str, str, dict[str, Any]]:
        """Return ``(name, raw arguments, parsed arguments)`` or raise ``_MalformedCall``."""
        raise NotImplementedError


class HermesToolParser(_TaggedToolParser):
    """Hermes / Qwen2.5 / Qwen3 calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    ``arguments`` must be present and be a JSON object, or a JSON string that itself parses to
    an object. The call's raw ``arguments`` is ``json.dumps(obj, ensure_ascii=False)`` for an
    object (the model's exact spacing is not kept, the parsed value is) and the inner string
    verbatim for a string. Keys other than ``name`` and ``arguments`` are ignored. A key given
    twice in any object is an error (JSON parsers would keep the last one silently). JSON values
    carry their own types, so the request's tool schemas are not needed.
    """

    def _parse_body(self, body: str, schemas: ToolSchemas) -> tuple[str, str, dict[str, Any]]:
        try:
            call = loads_strict(body)
        except DuplicateKeyError as error:
            raise _MalformedCall(f"tool call {error}", _name_despite_duplicates(body)) from None
        except ValueError as error:
            raise _MalformedCall(f"tool call is not valid JSON ({error})") from None
        if not isinstance(call, dict):
            raise _MalformedCall('tool call must be a JSON object with "name" and "arguments"')
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise _MalformedCall('tool call has no "name" string')
        if "arguments" not in call:
            raise _MalformedCall('tool call has no "arguments"', name)
        arguments = call["arguments"]
        if isinstance(arguments, dict):
            return name, json.dumps(arguments, ensure_ascii=False), arguments
        if not isinstance(arguments, str):
            raise _MalformedCall('"arguments" must be a JSON object', name)
        try:
            parsed = loads_strict(arguments)
        except DuplicateKeyError as error:
            raise _MalformedCall(f'"arguments" string {error}', name) from None
        except ValueError as error:
            raise _MalformedCall(f'"arguments" string is not valid JSON ({error})', name) from None
        if not isinstance(parsed, dict):
            raise _MalformedCall('"arguments" string must hold a JSON object', name)
        return name, arguments, parsed


def _name_despite_duplicates(body: str) -> str:
    """The call's ``name`` read as plain JSON parsers read it (last key wins), for an error's record."""
    try:
        name = json.loads(body).get("name")
    except (ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) else ""


class Qwen3CoderToolParser(_TaggedToolParser):
    """Qwen3-Coder XML calls: ``<function=NAME>`` holding ``<parameter=P>VALUE</parameter>`` items.

    A value loses exactly one leading and one trailing newline and is then read by the JSON
    type(s) the request's tool declares for it (``rllm.parser.values``), as vLLM's and SGLang's
    parsers do: a ``string`` stays the text as written (``12345``, ``true``, ``null``, ``[1]``
    included); ``integer``, ``number``, ``boolean`` (``true``/``True``), ``null``
    (``null``/``None``), ``object`` and ``array`` are parsed, trying a union's non-string types
    first. Text that fits none of its declared types is an error naming the parameter and type.
    A parameter with no declared type (no tools given, a tool or parameter the request does not
    declare, an untyped schema) is read schema-free: a JSON number, bool, null, object or array
    when it parses as one, else text. Duplicate parameters, repeated keys in a JSON value, a
    value containing ``<parameter=`` (an unclosed parameter) and any other text inside the
    function are errors.
    """

    def _parse_body(self, body: str, schemas: ToolSchemas) -> tuple[str, str, dict[str, Any]]:
        text = body.strip()
        head = _FUNCTION_OPEN.match(text)
        if head is None:
            raise _MalformedCall("tool call has no <function=NAME> opening")
        name = head.group(1)
        if not text.endswith(_FUNCTION_CLOSE) or head.end() > len(text) - len(_FUNCTION_CLOSE):
            raise _MalformedCall(f"<function={name}> is not closed by {_FUNCTION_CLOSE}", name)
        inner = text[head.end() : len(text) - len(_FUNCTION_CLOSE)]
        arguments: dict[str, Any] = {}
        pos = 0
        while (param := _PARAMETER.match(inner, pos)) is not None:
            key, raw = param.group(1), param.group(2)
            if key in arguments:
                raise _MalformedCall(f"parameter {key!r} is given twice", name)
            if "<parameter=" in raw:
                raise _MalformedCall(f"parameter {key!r} is not closed before the next one", name)
            try:
                arguments[key] = _parameter_value(raw, schemas.types(name, key))
            except DuplicateKeyError as error:
                raise _MalformedCall(f"parameter {key!r} {error}", name) from None
            except DeclaredTypeError as error:
                shown = _strip_newlines(raw)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise _MalformedCall(f"parameter {key!r} must be {error} as {name} declares it, got {shown!r}",
                                     name) from None
            pos = param.end()
        if inner[pos:].strip():
            raise _MalformedCall(f"unexpected text in <function={name}>: {inner[pos:].strip()[:80]!r}", name)
        return name, json.dumps(arguments, ensure_ascii=False), arguments


def _strip_newlines(raw: str) -> str:
    """The value as the template wrote it: one newline off each side."""
    value = raw[1:] if raw.startswith("\n") else raw
    return value[:-1] if value.endswith("\n") else value


def _parameter_value(raw: str, types: frozenset[str] | None) -> Any:
    """Read by the declared ``types``; with none, keep text unless it parses as a non-string JSON value."""
    value = _strip_newlines(raw)
    if types is not None:
        return read_declared(value, types)
    try:
        parsed = loads_strict(value)
    except DuplicateKeyError:
        raise
    except ValueError:
        return value
    return value if isinstance(parsed, str) else parsed


_PARSERS: Mapping[str, type[_TaggedToolParser]] = MappingProxyType(
    {"hermes": HermesToolParser, "qwen3": HermesToolParser, "qwen3_coder": Qwen3CoderToolParser}
)


def get_tool_parser(name: str, *, ids: Callable[[], str] | None = None) -> ToolCallParser:
    """A new parser for a format name: ``hermes``, ``qwen3`` (same as hermes) or ``qwen3_coder``."""
    try:
        parser_class = _PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(_PARSERS))}") from None
    return parser_class(ids)
