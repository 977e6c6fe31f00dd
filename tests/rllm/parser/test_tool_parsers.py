"""Strict tool-call parsing of raw completion text: Hermes/Qwen3 JSON and Qwen3-Coder XML."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel
from strands import tool

from rllm.integrations.strands._format import format_tools
from rllm.parser import (
    CallIdFactory,
    HermesToolParser,
    ParsedOutput,
    Qwen3CoderToolParser,
    get_tool_parser,
)
from rllm.types import ToolCall


def _ids() -> CallIdFactory:
    return CallIdFactory()


def test_hermes_single_call_with_content_before() -> None:
    text = (
        "Let me check the weather.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}\n</tool_call>'
        "<|im_end|>"
    )
    out = HermesToolParser().parse(text)
    assert out.content == "Let me check the weather."
    assert out.reasoning is None
    assert out.errors == []
    assert len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.name == "get_weather"
    assert call.input == {"city": "Zürich", "days": 2}
    assert call.arguments == '{"city": "Zürich", "days": 2}'
    assert call.error is None


def test_hermes_parallel_calls_and_text_between() -> None:
    text = (
        "First I search.\n"
        '<tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n</tool_call>\n'
        "then\n"
        '<tool_call>\n{"name": "search", "arguments": {"q": "b"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call>'
    )
    out = HermesToolParser().parse(text)
    assert [c.name for c in out.tool_calls] == ["search", "search", "calc"]
    assert [c.input for c in out.tool_calls] == [{"q": "a"}, {"q": "b"}, {"expr": "1+1"}]
    assert out.content == "First I search.\n\nthen"
    assert len({c.id for c in out.tool_calls}) == 3
    assert out.errors == []


def test_hermes_arguments_as_json_string_kept_verbatim() -> None:
    text = '<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\":  \\"2*3\\"}"}\n</tool_call>'
    call = HermesToolParser().parse(text).tool_calls[0]
    assert call.name == "calc"
    assert call.arguments == '{"expr":  "2*3"}'
    assert call.input == {"expr": "2*3"}
    assert call.error is None


def test_hermes_arguments_string_that_is_not_an_object_is_an_error() -> None:
    text = '<tool_call>\n{"name": "calc", "arguments": "[1, 2]"}\n</tool_call>'
    out = HermesToolParser().parse(text)
    call = out.tool_calls[0]
    assert call.name == "calc"
    assert call.input is None
    assert call.error == '"arguments" string must hold a JSON object'
    assert call.arguments == text
    assert out.errors == [f'tool call {call.id}: "arguments" string must hold a JSON object']


def test_hermes_arguments_list_is_an_error() -> None:
    out = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')
    assert out.tool_calls[0].name == "f"
    assert out.tool_calls[0].error == '"arguments" must be a JSON object'


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "search", "arguments": {"q": "a",}}',  # trailing comma
        "{'name': 'search', 'arguments': {'q': 'a'}}",  # single quotes
        '{"name": "search", "arguments": {"q": "a"}',  # missing closing brace
        '{"name": "search", "arguments": {"x": NaN}}',  # NaN is not JSON
    ],
)
def test_hermes_malformed_json_is_not_repaired(body: str) -> None:
    block = f"<tool_call>\n{body}\n</tool_call>"
    out = HermesToolParser().parse(f"Calling.\n{block}")
    assert out.content == "Calling."
    assert len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.name == ""
    assert call.input is None
    assert call.arguments == block
    assert call.error is not None and call.error.startswith("tool call is not valid JSON")
    assert out.errors == [f"tool call {call.id}: {call.error}"]


def test_hermes_unclosed_block_is_an_error_with_name_recovered() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "search", "arguments": {"q": "a"}}'
    out = HermesToolParser().parse(text + "<|im_end|>")
    assert out.content == "Sure."
    call = out.tool_calls[0]
    assert call.name == "search"
    assert call.input is None
    assert call.arguments == '<tool_call>\n{"name": "search", "arguments": {"q": "a"}}'
    assert call.error == "unclosed <tool_call>: no </tool_call> follows"
    assert len(out.errors) == 1


def test_hermes_unclosed_truncated_block_has_empty_name() -> None:
    out = HermesToolParser().parse('<tool_call>\n{"name": "sea')
    assert out.tool_calls[0].name == ""
    assert out.tool_calls[0].error == "unclosed <tool_call>: no </tool_call> follows"
    assert out.content == ""


def test_hermes_missing_name_and_missing_arguments() -> None:
    text = (
        '<tool_call>{"arguments": {"q": "a"}}</tool_call>\n'
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "search"}</tool_call>\n'
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    )
    out = HermesToolParser().parse(text)
    assert [c.name for c in out.tool_calls] == ["", "", "search", "ok"]
    assert [c.error for c in out.tool_calls] == [
        'tool call has no "name" string',
        'tool call has no "name" string',
        'tool call has no "arguments"',
        None,
    ]
    assert out.tool_calls[3].input == {}
    assert out.tool_calls[3].arguments == "{}"
    assert len(out.errors) == 3
    assert out.content == ""


def test_tool_call_inside_think_is_reasoning_only() -> None:
    text = (
        "<think>\nMaybe <tool_call>\n"
        '{"name": "draft", "arguments": {}}\n</tool_call> is right.\n</think>\n\n'
        'Answer: <tool_call>\n{"name": "real", "arguments": {"k": 1}}\n</tool_call>'
    )
    out = HermesToolParser().parse(text)
    assert out.reasoning == 'Maybe <tool_call>\n{"name": "draft", "arguments": {}}\n</tool_call> is right.'
    assert [c.name for c in out.tool_calls] == ["real"]
    assert out.tool_calls[0].input == {"k": 1}
    assert out.content == "Answer:"


def test_empty_think_block_gives_empty_reasoning() -> None:
    out = HermesToolParser().parse("<think>\n\n</think>\n\nHello!<|im_end|>")
    assert out == ParsedOutput(content="Hello!", reasoning="", tool_calls=[], errors=[])


def test_think_prefilled_with_draft_call_before_close() -> None:
    text = (
        'I could call <tool_call>\n{"name": "draft", "arguments": {}}\n</tool_call> but no.\n'
        "</think>\n\nThe answer is 4.<|im_end|>"
    )
    out = HermesToolParser().parse(text, think_prefilled=True)
    assert out.reasoning == 'I could call <tool_call>\n{"name": "draft", "arguments": {}}\n</tool_call> but no.'
    assert out.tool_calls == []
    assert out.errors == []
    assert out.content == "The answer is 4."


def test_think_prefilled_without_close_is_all_reasoning() -> None:
    text = 'Thinking... <tool_call>\n{"name": "draft", "arguments": {}}\n</tool_call><|im_end|><|endoftext|>'
    out = HermesToolParser().parse(text, think_prefilled=True)
    assert out.reasoning == 'Thinking... <tool_call>\n{"name": "draft", "arguments": {}}\n</tool_call>'
    assert out.tool_calls == []
    assert out.content == ""


def test_think_prefilled_then_real_call() -> None:
    text = 'plan\n</think>\n<tool_call>\n{"name": "go", "arguments": {}}\n</tool_call>'
    out = get_tool_parser("qwen3").parse(text, think_prefilled=True)
    assert out.reasoning == "plan"
    assert [(c.name, c.input) for c in out.tool_calls] == [("go", {})]
    assert out.content == ""


def test_end_of_turn_markers_stripped() -> None:
    out = HermesToolParser().parse("Done.<|im_end|>\n<|endoftext|>")
    assert out.content == "Done."
    assert out.tool_calls == []


def test_ids_unique_across_parses_sharing_a_factory() -> None:
    ids = _ids()
    parser = HermesToolParser()
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    first = parser.parse(call + call, ids=ids)
    second = HermesToolParser().parse(call, ids=ids)
    all_ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert len(set(all_ids)) == 3
    stem = all_ids[0].rsplit("_", 1)[0]
    assert re.fullmatch(r"call_[0-9a-f]{8}", stem)
    assert all_ids == [f"{stem}_000000", f"{stem}_000001", f"{stem}_000002"]


def test_default_ids_unique_within_parser_and_distinct_between_factories() -> None:
    parser = HermesToolParser()
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    a = parser.parse(call).tool_calls[0].id
    b = parser.parse(call).tool_calls[0].id
    assert a != b
    assert CallIdFactory()() != CallIdFactory()()


def test_qwen3_coder_typed_parameters() -> None:
    text = (
        "I'll write the file.\n"
        "<tool_call>\n<function=write_file>\n"
        "<parameter=path>\nsrc/main.py\n</parameter>\n"
        "<parameter=mode>\n420\n</parameter>\n"
        '<parameter=options>\n{"overwrite": true, "tags": ["a", null]}\n</parameter>\n'
        "<parameter=content>\ndef main():\n    return 1\n\n</parameter>\n"
        "<parameter=quoted>\n\"x\"\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>"
    )
    out = Qwen3CoderToolParser().parse(text)
    assert out.content == "I'll write the file."
    assert out.errors == []
    call = out.tool_calls[0]
    expected = {
        "path": "src/main.py",
        "mode": 420,
        "options": {"overwrite": True, "tags": ["a", None]},
        "content": "def main():\n    return 1\n",
        "quoted": '"x"',
    }
    assert call.name == "write_file"
    assert call.input == expected
    assert json.loads(call.arguments) == expected
    assert call.arguments == json.dumps(expected, ensure_ascii=False)


def test_qwen3_coder_parallel_calls_and_no_parameters() -> None:
    text = (
        "<tool_call>\n<function=now>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=add>\n<parameter=a>\n1.5\n</parameter>\n"
        "<parameter=flag>\nfalse\n</parameter>\n</function>\n</tool_call>"
    )
    out = get_tool_parser("qwen3_coder").parse(text)
    assert [(c.name, c.input, c.arguments) for c in out.tool_calls] == [
        ("now", {}, "{}"),
        ("add", {"a": 1.5, "flag": False}, '{"a": 1.5, "flag": false}'),
    ]


@pytest.mark.parametrize(
    ("body", "name", "error"),
    [
        ('{"name": "f", "arguments": {}}', "", "tool call has no <function=NAME> opening"),
        ("<function=f>\n<parameter=a>\n1\n</parameter>\n", "f", "<function=f> is not closed by </function>"),
        (
            "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
            "f",
            "parameter 'a' is given twice",
        ),
        (
            "<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>",
            "f",
            "parameter 'a' is not closed before the next one",
        ),
        ("<function=f>\nstray\n</function>", "f", "unexpected text in <function=f>: 'stray'"),
    ],
)
def test_qwen3_coder_malformed_blocks(body: str, name: str, error: str) -> None:
    block = f"<tool_call>\n{body}\n</tool_call>"
    out = Qwen3CoderToolParser().parse(block)
    call = out.tool_calls[0]
    assert (call.name, call.error, call.input, call.arguments) == (name, error, None, block)
    assert out.errors == [f"tool call {call.id}: {error}"]


def test_qwen3_coder_unclosed_block_and_think() -> None:
    text = (
        "<think>try <tool_call>\n<function=draft>\n</function>\n</tool_call></think>"
        "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n"
    )
    out = Qwen3CoderToolParser().parse(text)
    assert out.reasoning == "try <tool_call>\n<function=draft>\n</function>\n</tool_call>"
    assert len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.name == "run"
    assert call.error == "unclosed <tool_call>: no </tool_call> follows"
    assert call.arguments == "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>"


def test_get_tool_parser_names_and_errors() -> None:
    assert isinstance(get_tool_parser("hermes"), HermesToolParser)
    assert isinstance(get_tool_parser("qwen3"), HermesToolParser)
    assert isinstance(get_tool_parser("qwen3_coder"), Qwen3CoderToolParser)
    with pytest.raises(ValueError, match=r"unknown tool parser 'llama3'; known: hermes, qwen3, qwen3_coder"):
        get_tool_parser("llama3")


def test_tool_calls_are_valid_records() -> None:
    out = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": {"x": [1]}}</tool_call>')
    call = out.tool_calls[0]
    assert ToolCall.model_validate_json(call.model_dump_json()) == call
    assert ToolCall.from_arguments(call.id, call.name, call.arguments) == call


# ---------------------------------------------------------------- Qwen3-Coder values by the tool's declared types
class _Pair(BaseModel):
    x: int
    y: int


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


@tool
def configure(count: int, ratio: float, verbose: bool, options: dict[str, int], tags: list[str],
              pair: _Pair | None = None, note: str | None = None, limit: int | None = None,
              either: int | str = 0) -> str:
    """Configure a run."""
    return "ok"


TOOLS = format_tools([lookup.tool_spec, configure.tool_spec])  # the request's tools, as engines receive them


def _coder_call(name: str, **parameters: str) -> str:
    """A Qwen3-Coder call with each value written as raw text, the way the template writes it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize("text", ["12345", "true", "null", "[1]", '{"a": 1}', "-0.5"])
def test_qwen3_coder_string_parameter_that_looks_like_json_stays_text(text: str) -> None:
    out = get_tool_parser("qwen3_coder").parse(_coder_call("lookup", key=text), tools=TOOLS)
    call = out.tool_calls[0]
    assert (call.error, call.input) == (None, {"key": text})
    assert json.loads(call.arguments) == {"key": text}


def test_qwen3_coder_declared_types_are_parsed() -> None:
    text = _coder_call("configure", count="3", ratio="2.5", verbose="True", options='{"a": 1, "b": 2}',
                       tags='["x", "12"]', pair='{"x": 1, "y": 2}', note="None", limit="null", either="7")
    out = get_tool_parser("qwen3_coder").parse(text, tools=TOOLS)
    assert out.errors == []
    assert out.tool_calls[0].input == {"count": 3, "ratio": 2.5, "verbose": True, "options": {"a": 1, "b": 2},
                                       "tags": ["x", "12"], "pair": {"x": 1, "y": 2}, "note": None, "limit": None,
                                       "either": 7}
    # A union with string keeps text that fits none of its other types; a whole-number float is an integer.
    out = get_tool_parser("qwen3_coder").parse(
        _coder_call("configure", count="4.0", ratio="1", verbose="false", note="null", either="seven"), tools=TOOLS)
    assert out.tool_calls[0].input == {"count": 4, "ratio": 1, "verbose": False, "note": None, "either": "seven"}


@pytest.mark.parametrize(
    ("parameter", "text", "error"),
    [
        ("count", "three", "parameter 'count' must be integer as configure declares it, got 'three'"),
        ("count", "1.5", "parameter 'count' must be integer as configure declares it, got '1.5'"),
        ("ratio", "1,5", "parameter 'ratio' must be number as configure declares it, got '1,5'"),
        ("verbose", "yes", "parameter 'verbose' must be boolean as configure declares it, got 'yes'"),
        ("options", "[1]", "parameter 'options' must be object as configure declares it, got '[1]'"),
        ("tags", "x", "parameter 'tags' must be array as configure declares it, got 'x'"),
        ("limit", "none at all", "parameter 'limit' must be integer or null as configure declares it, got 'none at all'"),
        ("pair", "(1, 2)", "parameter 'pair' must be object or null as configure declares it, got '(1, 2)'"),
        ("count", "NaN", "parameter 'count' must be integer as configure declares it, got 'NaN'"),
    ],
)
def test_qwen3_coder_value_that_does_not_fit_its_declared_type_is_an_error(parameter: str, text: str, error: str) -> None:
    block = _coder_call("configure", **{parameter: text})
    out = get_tool_parser("qwen3_coder").parse(f"Configuring.\n{block}", tools=TOOLS)
    call = out.tool_calls[0]
    assert (call.name, call.error, call.input, call.arguments) == ("configure", error, None, block)
    assert out.errors == [f"tool call {call.id}: {error}"]
    assert out.content == "Configuring."


def test_qwen3_coder_without_a_schema_keeps_schema_free_conversion() -> None:
    parser = get_tool_parser("qwen3_coder")
    expected = {"key": 12345, "flag": True, "none": None, "items": [1], "text": "box 7"}
    values = {"key": "12345", "flag": "true", "none": "null", "items": "[1]", "text": "box 7"}
    assert parser.parse(_coder_call("lookup", **values)).tool_calls[0].input == expected  # no tools given
    assert parser.parse(_coder_call("unknown", **values), tools=TOOLS).tool_calls[0].input == expected  # undeclared tool
    untyped = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
               {"type": "function", "function": {"name": "anything", "parameters": {
                   "type": "object", "properties": {"key": {"description": "no type"}, "flag": {}}}}}]
    assert parser.parse(_coder_call("lookup", **values), tools=untyped).tool_calls[0].input == expected
    assert parser.parse(_coder_call("anything", **values), tools=untyped).tool_calls[0].input == expected
    # A parameter the tool does not declare is read schema-free too, beside a declared one.
    out = parser.parse(_coder_call("lookup", key="12345", extra="12345"), tools=TOOLS)
    assert out.tool_calls[0].input == {"key": "12345", "extra": 12345}


def test_qwen3_coder_reads_type_lists_unions_enums_and_refs_in_raw_schemas() -> None:
    properties = {
        "listed": {"type": ["integer", "null"]},
        "one_of": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"}}]},
        "enum": {"enum": [1, 2, 3]},
        "const": {"const": "12"},
        "ref": {"$ref": "#/$defs/Point"},
        "all_of": {"allOf": [{"$ref": "#/definitions/Count"}, {"description": "how many"}]},
    }
    tools = [{"type": "function", "function": {"name": "raw", "parameters": {
        "type": "object", "properties": properties,
        "$defs": {"Point": {"type": "object"}}, "definitions": {"Count": {"type": "integer"}}}}}]
    text = _coder_call("raw", listed="None", one_of='["a"]', enum="2", const="12", ref='{"x": 1}', all_of="5")
    out = get_tool_parser("qwen3_coder").parse(text, tools=tools)
    assert out.tool_calls[0].input == {"listed": None, "one_of": ["a"], "enum": 2, "const": "12", "ref": {"x": 1},
                                       "all_of": 5}
    out = get_tool_parser("qwen3_coder").parse(_coder_call("raw", one_of="maybe"), tools=tools)
    assert out.tool_calls[0].error == "parameter 'one_of' must be boolean or array as raw declares it, got 'maybe'"


# ---------------------------------------------------------------- duplicate JSON keys
@pytest.mark.parametrize(
    ("body", "name", "error"),
    [
        ('{"name": "f", "arguments": {"a": 1, "a": 2}}', "f", "tool call gives the JSON key 'a' twice"),
        ('{"name": "f", "arguments": {"a": {"b": [{"c": 1, "c": 1}]}}}', "f", "tool call gives the JSON key 'c' twice"),
        ('{"name": "f", "name": "g", "arguments": {}}', "g", "tool call gives the JSON key 'name' twice"),
        ('{"name": "f", "arguments": "{\\"a\\": 1, \\"a\\": 2}"}', "f", "\"arguments\" string gives the JSON key 'a' twice"),
    ],
)
def test_hermes_duplicate_json_keys_are_an_error(body: str, name: str, error: str) -> None:
    block = f"<tool_call>\n{body}\n</tool_call>"
    out = HermesToolParser().parse(block)
    call = out.tool_calls[0]
    assert (call.name, call.error, call.input, call.arguments) == (name, error, None, block)
    assert out.errors == [f"tool call {call.id}: {error}"]


def test_qwen3_coder_duplicate_json_keys_in_a_value_are_an_error() -> None:
    parser = get_tool_parser("qwen3_coder")
    text = _coder_call("configure", options='{"a": 1, "a": 2}')
    assert parser.parse(text, tools=TOOLS).tool_calls[0].error == "parameter 'options' gives the JSON key 'a' twice"
    assert parser.parse(text).tool_calls[0].error == "parameter 'options' gives the JSON key 'a' twice"  # schema-free
    # A declared string is never read as JSON, so its text may hold anything.
    text = _coder_call("lookup", key='{"a": 1, "a": 2}')
    assert parser.parse(text, tools=TOOLS).tool_calls[0].input == {"key": '{"a": 1, "a": 2}'}


# ---------------------------------------------------------------- call ids in call order
@pytest.mark.parametrize("name", ["hermes", "qwen3_coder"])
def test_call_ids_sort_in_call_order(name: str) -> None:
    calls = {"hermes": '<tool_call>{{"name": "f", "arguments": {{"n": {n}}}}}</tool_call>',
             "qwen3_coder": "<tool_call>\n<function=f>\n<parameter=n>\n{n}\n</parameter>\n</function>\n</tool_call>"}
    ids = CallIdFactory()
    first = get_tool_parser(name).parse("".join(calls[name].format(n=n) for n in range(12)), ids=ids)
    second = get_tool_parser(name).parse(calls[name].format(n=12), ids=ids)
    out = first.tool_calls + second.tool_calls
    assert [c.input for c in out] == [{"n": n} for n in range(13)]
    assert sorted(c.id for c in out) == [c.id for c in out]
