"""Traces to training data: steps in call order, prefix-extending calls merged into one token sequence."""

from __future__ import annotations

import json
import random

from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall, ToyChatTokens
from rllm.tracing.records import make_trace
from rllm.tracing.trajectory import trajectory_from_traces

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def _raw(messages: list[dict], reply: ScriptedReply, *, logprobs: bool = True, token_ids: bool = True) -> dict:
    """A vLLM-style JSON reply whose ids come from the toy template."""
    completion = ToyChatTokens.completion_ids(reply)
    message = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls]
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
    raw = {"id": "x", "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": len(completion)}}
    if token_ids:
        raw["prompt_token_ids"] = ToyChatTokens.prompt_ids(messages)
        choice["token_ids"] = completion
    if logprobs:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.5 - i} for i in range(len(completion))]}
    return raw


def _rollout(turns: int, **kw: object) -> tuple[list[dict], list[list[int]]]:
    """A search-agent conversation: ``turns - 1`` tool calls then an answer; traces and the served completions."""
    messages: list[dict] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "who?"}]
    traces, served = [], []
    for seq in range(turns):
        last = seq == turns - 1
        reply = ScriptedReply(content="\\boxed{Ada}" if last else "",
                              tool_calls=[] if last else [ScriptedToolCall("search", json.dumps({"q": f"q{seq}"}),
                                                                           id=f"c{seq}")])
        raw = _raw(messages, reply, **kw)
        served.append(raw["choices"][0].get("token_ids"))
        traces.append(make_trace(session_id="s", seq=seq, no_session=False, model="m", backend="b",
                                 params={"messages": list(messages), "tools": TOOLS, "temperature": 0.7},
                                 stream=bool(seq % 2), started_at=0.0, raw_response=raw))
        messages = [*messages, raw["choices"][0]["message"]]
        if not last:
            messages.append({"role": "tool", "tool_call_id": f"c{seq}", "content": f"result {seq}"})
    return traces, served


def test_extending_calls_merge_into_one_sequence_equal_to_the_served_ids() -> None:
    traces, served = _rollout(4)
    random.Random(0).shuffle(traces)  # read order must not matter: seq decides
    result = trajectory_from_traces(traces)
    steps = result.trajectory.steps
    assert [s.info["seq"] for s in steps] == [0, 1, 2, 3]
    assert result.report() == {"steps": 4, "token_sequences": 1, "merged_calls": 3, "separate_calls": 1,
                               "calls_without_token_ids": 0, "failed_calls": 0}
    trace = result.trajectory.token_trace
    assert trace is not None and result.token_traces == [trace]
    last = steps[-1].model_output
    assert trace.token_ids == last.prompt_ids + last.completion_ids
    assert [t for t, m in zip(trace.token_ids, trace.loss_mask) if m] == [i for ids in served for i in ids]
    assert [lp for lp, m in zip(trace.logprobs, trace.loss_mask) if m] == [
        lp for s in steps for lp in s.model_output.logprobs]
    assert trace.num_turns == 4
    # Steps carry the exact call: messages, tools, parsed tool calls, sampling, and the tool results that answered.
    assert steps[0].tools == TOOLS and steps[0].info["sampling"] == {"temperature": 0.7}
    assert steps[0].tool_calls[0].input == {"q": "q0"}
    assert steps[0].observation == [{"role": "tool", "tool_call_id": "c0", "content": "result 0"}]
    assert steps[-1].model_output.text == "\\boxed{Ada}" and steps[-1].done and not steps[-1].observation


def test_a_call_that_does_not_extend_starts_a_new_sequence() -> None:
    traces, served = _rollout(4)
    # The agent rewrote its history before the third call (e.g. summarised it): its prompt no longer extends.
    rewritten = [2, 1100, 5, 3]
    traces[2]["response"]["prompt_token_ids"] = rewritten
    tool_result = ToyChatTokens.message_ids({"role": "tool", "content": "result 2"})
    traces[3]["response"]["prompt_token_ids"] = rewritten + served[2] + tool_result + [3]
    result = trajectory_from_traces(traces)
    assert result.report()["token_sequences"] == 2
    assert (result.merged_calls, result.separate_calls) == (2, 2)
    assert result.trajectory.token_trace is None
    assert [s.info["token_sequence"] for s in result.trajectory.steps] == [0, 0, 1, 1]
    second = result.token_traces[1]
    assert second.token_ids[:4] == [2, 1100, 5, 3]
    assert [t for t, m in zip(second.token_ids, second.loss_mask) if m] == served[2] + served[3]


def test_calls_without_token_ids_or_that_failed_are_counted_not_merged() -> None:
    traces, _ = _rollout(3)
    no_ids = _rollout(1, token_ids=False)[0][0]
    no_ids["seq"] = 3
    failed = make_trace(session_id="s", seq=4, no_session=False, model="m", backend="b", params={"messages": []},
                        stream=False, started_at=0.0, raw_response=None,
                        error={"type": "upstream_status", "status": 500, "message": "boom"})
    result = trajectory_from_traces([*traces, no_ids, failed])
    assert result.report() == {"steps": 4, "token_sequences": 1, "merged_calls": 2, "separate_calls": 1,
                               "calls_without_token_ids": 1, "failed_calls": 1}
    assert result.trajectory.token_trace is None  # one call is missing from the sequence


def test_missing_logprobs_still_merge_without_them() -> None:
    traces, served = _rollout(3, logprobs=False)
    result = trajectory_from_traces(traces)
    trace = result.token_traces[0]
    assert result.merged_calls == 2 and not trace.require_logprobs
    assert [t for t, m in zip(trace.token_ids, trace.loss_mask) if m] == [i for ids in served for i in ids]
