"""Token engines read Qwen3-Coder arguments by the request's tool schemas.

A real Strands agent runs on a token engine whose scripted policy samples exactly what each
family's real chat template writes for a call: ``lookup(key="12345")`` renders as the bare text
``12345``, so only the tool's declared ``string`` type says it is not a number.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from strands import tool

from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine

CODER_FAMILIES = [name for name, family in FAMILIES.items() if family.tool_parser == "qwen3_coder"]


class _Tools:
    """Real Strands tools that record the arguments they ran with, types included."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []

        @tool
        def lookup(key: str) -> str:
            """Look a key up.

            Args:
                key: What to look up.
            """
            self.ran.append(("lookup", key))
            return f"{key} holds item 12"

        @tool
        def page(number: int, exact: bool) -> str:
            """Open a page.

            Args:
                number: The page number.
                exact: Whether to match exactly.
            """
            self.ran.append(("page", (number, exact)))
            return f"page {number}"

        self.tools = [lookup, page]


def _call_then_answer(calls: list[tuple[str, dict[str, Any]]]) -> Any:
    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in messages):
            return {"content": "", "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(calls)]}
        return {"content": "\\boxed{12}"}

    return script


@pytest.mark.parametrize("name", CODER_FAMILIES)
async def test_string_parameter_written_as_digits_reaches_the_tool_as_a_string(name: str) -> None:
    family = FAMILIES[name]
    tools = _Tools()
    engine = MessageScriptedEngine(family.tokenizer(), _call_then_answer(
        [("lookup", {"key": "12345"}), ("page", {"number": 3, "exact": True})]), tool_parser="qwen3_coder",
        chat_template_kwargs=family.chat_template_kwargs)
    agent = StrandsAgent(RLLMModel(engine), tools=tools.tools, system_prompt="Answer in \\boxed{}.")

    await agent.invoke_async("What does key 12345 hold?")

    first = agent.trajectory.steps[0]
    sampled = engine.tokenizer.decode(first.model_output.completion_ids)
    assert "<parameter=key>\n12345\n</parameter>" in sampled  # the template writes the string bare
    assert [(c.name, c.input, c.error) for c in first.tool_calls] == [
        ("lookup", {"key": "12345"}, None), ("page", {"number": 3, "exact": True}, None)]
    assert sorted(tools.ran, key=str) == [("lookup", "12345"), ("page", (3, True))]
    assert agent.trajectory.num_tool_errors == 0
    assert agent.trajectory.steps[-1].model_output.text == "\\boxed{12}"


async def test_a_value_that_does_not_fit_its_declared_type_is_shown_to_the_model_and_never_runs() -> None:
    tools = _Tools()
    bad = "<tool_call>\n<function=page>\n<parameter=number>\nthree\n</parameter>\n" \
          "<parameter=exact>\ntrue\n</parameter>\n</function>\n</tool_call>"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any] | str:
        return bad if not any(m["role"] == "tool" for m in messages) else {"content": "\\boxed{?}"}

    engine = MessageScriptedEngine(FAMILIES["qwen3_coder"].tokenizer(), script, tool_parser="qwen3_coder")
    agent = StrandsAgent(RLLMModel(engine), tools=tools.tools, system_prompt="Answer in \\boxed{}.")

    await agent.invoke_async("Open page three.")

    call = agent.trajectory.steps[0].tool_calls[0]
    assert call.error == "parameter 'number' must be integer as page declares it, got 'three'"
    assert tools.ran == [] and agent.trajectory.num_tool_errors == 1
    shown = engine.tokenizer.decode(engine.prompts[1][len(engine.prompts[0]):])
    assert "parameter 'number' must be integer as page declares it" in shown  # the model reads its mistake
