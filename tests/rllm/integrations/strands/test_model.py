"""RLLMModel against a real HTTP server: what it sends (tool calls, tool messages, tool_choice), the Strands
events it yields, token ids it records and the errors it maps to Strands exceptions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures.strands_agents import (
    REQUEST_KEYS,
    SYSTEM,
    ToolLog,
    make_agent,
    two_tools_then_answer,
)
from strands import Agent, tool
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.types import TerminationReason


async def test_requests_carry_tool_calls_and_tool_messages_not_prose(serve) -> None:
    server = serve(two_tools_then_answer)
    tools = ToolLog()
    agent = make_agent(server, tools)

    result = await agent.invoke_async("what is 2+3?")

    assert "\\boxed{5}" in str(result)
    first, second = server.requests
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": "what is 2+3?"}]},
    ]
    assert [t["function"]["name"] for t in first["tools"]] == ["add", "lookup", "explode", "quota"]
    assert first["tools"][0]["function"]["description"] == "Add two integers and return the sum."
    assert "tool_choice" not in first and "tool_choice" not in second  # never forced

    tag = str(abs(hash("what is 2+3?")) % 10_000)
    assistant, add_result, lookup_result = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert assistant["reasoning_content"] == "I should add and look up."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] == [
        (f"call_add_{tag}", "add", {"a": 2, "b": 3}),
        (f"call_lookup_{tag}", "lookup", {"key": "what is 2+3?"}),
    ]
    assert add_result == {"role": "tool", "tool_call_id": f"call_add_{tag}", "content": "5"}
    assert lookup_result["role"] == "tool" and lookup_result["tool_call_id"] == f"call_lookup_{tag}"
    # Both blocks of the result survive: the text and the json.
    text, data = lookup_result["content"].split("\n", 1)
    assert text == "found what is 2+3?" and json.loads(data) == {"key": "what is 2+3?", "hits": 2}
    assert tools.calls == [("add", {"a": 2, "b": 3}), ("lookup", {"key": "what is 2+3?"})]
    for request in server.requests:
        assert set(request) <= REQUEST_KEYS, set(request) - REQUEST_KEYS
        assert request["temperature"] == 0.7


async def test_vllm_token_ids_and_logprobs_are_recorded(serve) -> None:
    server = serve([ScriptedReply(content="hi", prompt_token_ids=[1, 2, 3], token_ids=[7, 8], logprobs=[-0.5, -0.25])])
    engine = OpenAIEngine(model="scripted", base_url=server.base_url, return_token_ids=True)
    agent = StrandsAgent(RLLMModel(engine))

    await agent.invoke_async("hello")

    assert server.requests[0]["return_token_ids"] is True and server.requests[0]["logprobs"] is True
    output = agent.trajectory.steps[0].model_output
    assert (output.prompt_ids, output.completion_ids, output.logprobs) == ([1, 2, 3], [7, 8], [-0.5, -0.25])


async def test_context_overflow_and_throttling_map_to_strands_exceptions(serve) -> None:
    overflow = serve([ScriptedReply(status=400, error="This model's maximum context length is 4096 tokens.")])
    agent = StrandsAgent(RLLMModel(OpenAIEngine(model="m", base_url=overflow.base_url)))
    with pytest.raises(ContextWindowOverflowException):
        await agent.invoke_async("long prompt")
    assert agent.termination_reason is TerminationReason.CONTEXT_OVERFLOW
    assert len(overflow.requests) == 1

    throttled = serve([ScriptedReply(status=429, error="slow down")] * 3)
    engine = OpenAIEngine(model="m", base_url=throttled.base_url, max_retries=2, backoff_initial=0.01, backoff_max=0.02)
    agent = StrandsAgent(RLLMModel(engine))
    with pytest.raises(ModelThrottledException):
        await agent.invoke_async("hi")
    assert agent.termination_reason is TerminationReason.ENGINE_ERROR
    assert len(throttled.requests) == 3


async def test_strands_event_sequences(serve) -> None:
    server = serve([
        ScriptedReply(content="plain answer", usage={"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}),
        ScriptedReply(tool_calls=[ScriptedToolCall("add", '{"a": 1, "b": 2}', id="t1")]),
        ScriptedReply(content="cut of", finish_reason="length"),
    ])
    model = RLLMModel(OpenAIEngine(model="m", base_url=server.base_url))
    messages = [{"role": "user", "content": [{"text": "hi"}]}]

    async def kinds() -> list[Any]:
        return [event async for event in model.stream(messages)]

    text = await kinds()
    assert [next(iter(e)) for e in text] == [
        "messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"]
    assert text[2]["contentBlockDelta"]["delta"] == {"text": "plain answer"}
    assert text[4] == {"messageStop": {"stopReason": "end_turn"}}
    assert text[5]["metadata"]["usage"] == {"inputTokens": 11, "outputTokens": 3, "totalTokens": 14}

    tool_use = await kinds()
    assert tool_use[1] == {"contentBlockStart": {"start": {"toolUse": {"name": "add", "toolUseId": "t1"}}}}
    assert tool_use[2] == {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"a": 1, "b": 2}'}}}}
    assert tool_use[4] == {"messageStop": {"stopReason": "tool_use"}}

    truncated = await kinds()
    assert truncated[4] == {"messageStop": {"stopReason": "max_tokens"}}


async def test_tool_choice_is_passed_through_not_forced(serve) -> None:
    server = serve([ScriptedReply(content="a"), ScriptedReply(content="b"), ScriptedReply(content="c")])
    model = RLLMModel(OpenAIEngine(model="m", base_url=server.base_url))
    messages = [{"role": "user", "content": [{"text": "hi"}]}]
    specs = [ToolLog().tools[0].tool_spec]

    for choice in (None, {"auto": {}}, {"tool": {"name": "add"}}):
        async for _ in model.stream(messages, specs, tool_choice=choice):
            pass

    assert [r.get("tool_choice") for r in server.requests] == [
        None, "auto", {"type": "function", "function": {"name": "add"}}]


TWO_BLOCK_SYSTEM = [{"text": "You answer briefly."}, {"text": "Put the answer in \\boxed{}."}]


async def test_a_system_prompt_in_blocks_is_sent_as_one_system_message(serve) -> None:
    server = serve([ScriptedReply(content="ok")])
    agent = Agent(model=RLLMModel(OpenAIEngine(model="m", base_url=server.base_url)), system_prompt=TWO_BLOCK_SYSTEM,
                  callback_handler=None)

    await agent.invoke_async("hi")

    system = [m for m in server.requests[0]["messages"] if m["role"] == "system"]
    assert system == [{"role": "system", "content": "You answer briefly.\nPut the answer in \\boxed{}."}]


@pytest.mark.parametrize("name", sorted(FAMILIES))
async def test_a_system_prompt_in_blocks_renders_one_system_turn_on_every_template(name: str) -> None:
    family = FAMILIES[name]
    engine = MessageScriptedEngine(family.tokenizer(), lambda messages: {"content": "ok"},
                                   tool_parser=family.tool_parser, chat_template_kwargs=family.chat_template_kwargs)
    agent = Agent(model=RLLMModel(engine), system_prompt=TWO_BLOCK_SYSTEM, callback_handler=None)

    result = await agent.invoke_async("hi")  # Qwen3.5/3.6 refuse a second system message outright

    assert str(result).strip() == "ok"
    prompt = engine.tokenizer.decode(engine.prompts[0])
    assert prompt.count("<|im_start|>system") == 1
    assert "You answer briefly.\nPut the answer in \\boxed{}." in prompt


def _optional_argument_tool(ran: list[dict[str, Any]]) -> Any:
    """A tool Strands would happily run with ``{}``: its one argument has a default."""

    @tool
    def note(text: str = "nothing") -> str:
        """Write a note down."""
        ran.append({"text": text})
        return f"noted {text}"

    return note


def _tool_results(agent: Agent) -> list[dict[str, Any]]:
    return [b["toolResult"] for m in agent.messages for b in m["content"] if "toolResult" in b]


@pytest.mark.parametrize(("arguments", "expected"), [
    ('{"text": "hi', "arguments are not valid JSON"),
    ('["hi"]', "arguments must be a JSON object"),
])
async def test_a_malformed_call_never_runs_under_a_plain_strands_agent(serve, arguments: str, expected: str) -> None:
    server = serve([ScriptedReply(tool_calls=[ScriptedToolCall("note", arguments, id="bad")]), ScriptedReply(content="ok")])
    ran: list[dict[str, Any]] = []
    agent = Agent(model=RLLMModel(OpenAIEngine(model="m", base_url=server.base_url)),
                  tools=[_optional_argument_tool(ran)], callback_handler=None)

    await agent.invoke_async("note something")

    assert ran == []
    [result] = _tool_results(agent)
    assert result["status"] == "error" and result["toolUseId"] == "bad"
    text = result["content"][0]["text"]
    assert text.startswith("Error: invalid arguments for tool 'note'") and expected in text and arguments in text
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["tool_call_id"] == "bad" and expected in tool_message["content"]


@pytest.mark.parametrize(("broken", "expected"), [
    ('<tool_call>\n{"name": "note", "arguments": {"text": "a", "text": "b"}}\n</tool_call>',
     "Error: invalid arguments for tool 'note': tool call gives the JSON key 'text' twice"),
    ('<tool_call>\n{"name": "note", "arguments": {"text": "hi"}\n</tool_call>',  # one brace short: no name
     "Error: invalid tool call: "),
])
async def test_a_malformed_call_from_a_token_engine_never_runs_under_a_plain_strands_agent(broken: str,
                                                                                           expected: str) -> None:
    family = FAMILIES["qwen3"]

    def script(messages: list[dict[str, Any]]) -> Any:
        return broken if not any(m["role"] == "tool" for m in messages) else {"content": "ok"}

    ran: list[dict[str, Any]] = []
    engine = MessageScriptedEngine(family.tokenizer(), script, tool_parser=family.tool_parser)
    agent = Agent(model=RLLMModel(engine), tools=[_optional_argument_tool(ran)], callback_handler=None)

    await agent.invoke_async("note something")

    assert ran == []
    [result] = _tool_results(agent)
    assert result["status"] == "error" and result["content"][0]["text"].startswith(expected)
    assert broken in engine.tokenizer.decode(engine.prompts[1])  # the model's own tokens, then the error
