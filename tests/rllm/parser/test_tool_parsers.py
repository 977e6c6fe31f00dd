"""Strict tool-call parsing of raw completion text: Hermes/Qwen3 JSON and Qwen3-Coder XML."""

from __future__ import annotations

import json
import re

import pytest

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
    assert all_ids == [f"{stem}_0", f"{stem}_1", f"{stem}_2"]


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
