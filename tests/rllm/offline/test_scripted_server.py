"""Tests for the scripted OpenAI-compatible server, driven by the real ``openai`` client."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

MESSAGES = [{"role": "user", "content": "hi"}]


def _client(srv: ScriptedOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0)


def test_non_streamed_tool_call_roundtrip() -> None:
    reply = ScriptedReply(content=None, tool_calls=[ScriptedToolCall("search", '{"q": "x"', id="call_abc")])
    with ScriptedOpenAIServer([reply]) as srv:
        resp = _client(srv).chat.completions.create(model="m", messages=MESSAGES)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == ("call_abc", "search", '{"q": "x"')
    assert resp.usage.prompt_tokens == 10 and resp.usage.completion_tokens == 5


def test_default_script_health_and_models() -> None:
    with ScriptedOpenAIServer(model="mine") as srv:
        assert _client(srv).chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "ok"
        assert httpx.get(srv.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        assert [m.id for m in _client(srv).models.list()] == ["mine"]


@pytest.mark.asyncio
async def test_streamed_text_and_two_tool_calls() -> None:
    reply = ScriptedReply(
        content="Let me look that up.",
        reasoning_content="thinking",
        tool_calls=[ScriptedToolCall("search", '{"query": "weather in Paris"}'), ScriptedToolCall("noop", "")],
    )
    async with ScriptedOpenAIServer(lambda body: reply) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        text, calls, finish, usage = "", {}, None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
                for tc in choice.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    entry["id"] = tc.id or entry["id"]
                    if tc.function:
                        entry["name"] = tc.function.name or entry["name"]
                        entry["arguments"] += tc.function.arguments or ""
        await client.close()
    assert text == "Let me look that up."
    assert finish == "tool_calls"
    assert [calls[i]["name"] for i in sorted(calls)] == ["search", "noop"]
    assert json.loads(calls[0]["arguments"]) == {"query": "weather in Paris"}
    assert calls[1]["arguments"] == ""
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["id"].startswith("call_")
    assert usage.total_tokens == 15


def test_stream_helper_accumulates() -> None:
    reply = ScriptedReply(content="abcdefg", tool_calls=[ScriptedToolCall("f", '{"a": 1}', id="c1")])
    with ScriptedOpenAIServer([reply]) as srv:
        with _client(srv).chat.completions.stream(model="m", messages=MESSAGES) as stream:
            final = stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "abcdefg"
    assert msg.tool_calls[0].id == "c1" and msg.tool_calls[0].function.arguments == '{"a": 1}'


def test_return_token_ids_and_logprobs() -> None:
    replies = [
        ScriptedReply(content="a", prompt_token_ids=[1, 2, 3], token_ids=[7, 8], logprobs=[-0.5, -0.25]),
        ScriptedReply(content="b"),
    ]
    with ScriptedOpenAIServer(replies) as srv:
        client = _client(srv)
        extra = {"return_token_ids": True}
        raw = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True, extra_body=extra)
        synth = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True, extra_body=extra)
    data = raw.model_dump()
    assert data["prompt_token_ids"] == [1, 2, 3]
    assert data["choices"][0]["token_ids"] == [7, 8]
    assert [e.logprob for e in raw.choices[0].logprobs.content] == [-0.5, -0.25]
    assert raw.usage.prompt_tokens == 3 and raw.usage.completion_tokens == 2
    assert synth.model_dump()["prompt_token_ids"] == list(range(10))
    assert synth.model_dump()["choices"][0]["token_ids"] == list(range(100, 105))
    assert [e.logprob for e in synth.choices[0].logprobs.content] == [-0.1] * 5


def test_error_status_and_recorded_requests() -> None:
    replies = [ScriptedReply(content="first"), ScriptedReply(status=429, error="slow down")]
    with ScriptedOpenAIServer(replies) as srv:
        client = _client(srv)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}])
        assert info.value.status_code == 429 and "slow down" in info.value.message
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "three"}])
        assert info.value.status_code == 500 and "exhausted" in info.value.message
        assert [r["messages"][0]["content"] for r in srv.requests] == ["one", "two", "three"]
        srv.clear()
        assert srv.requests == []


def test_delay_triggers_client_timeout() -> None:
    with ScriptedOpenAIServer(lambda body: ScriptedReply(content="late", delay=0.5)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0, timeout=0.1)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="m", messages=MESSAGES)


@pytest.mark.asyncio
async def test_many_concurrent_requests() -> None:
    def script(body: dict) -> ScriptedReply:
        return ScriptedReply(content=body["messages"][0]["content"].upper(), delay=0.05)

    async with ScriptedOpenAIServer(script) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0)

        async def ask(i: int) -> str:
            resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
            return resp.choices[0].message.content

        answers = await asyncio.gather(*(ask(i) for i in range(256)))
        await client.close()
        assert answers == [f"Q{i}" for i in range(256)]
        assert len(srv.requests) == 256


@pytest.mark.asyncio
async def test_strands_openai_model_reassembles_tool_calls() -> None:
    strands_openai = pytest.importorskip("strands.models.openai")
    reply = ScriptedReply(content="Checking.", tool_calls=[ScriptedToolCall("search", '{"query": "paris"}', id="t1")])
    async with ScriptedOpenAIServer([reply]) as srv:
        model = strands_openai.OpenAIModel(client_args={"base_url": srv.base_url, "api_key": "test"}, model_id="m")
        events = [e async for e in model.stream([{"role": "user", "content": [{"text": "hi"}]}])]
    starts = [e["contentBlockStart"]["start"] for e in events if "contentBlockStart" in e]
    assert {"toolUse": {"name": "search", "toolUseId": "t1"}} in starts
    tool_input = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    )
    assert json.loads(tool_input) == {"query": "paris"}
    assert events[-2] == {"messageStop": {"stopReason": "tool_use"}}
    assert events[-1]["metadata"]["usage"]["totalTokens"] == 15
