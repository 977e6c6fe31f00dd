"""Token-in/token-out rollouts: exact traces through Qwen's real tokenizer and Qwen3's shipped template.

A scripted token policy emits chosen text as real token ids; the agents are real Strands agents
with real tools; SGLang and vLLM engines talk to scripted servers over real HTTP; the
``TransformersEngine`` runs a tiny random-init ``Qwen3ForCausalLM`` sized to the real vocabulary.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from strands import tool

from rllm.engine.rollout.sglang_engine import SGLangEngine
from rllm.engine.rollout.token_engine import TokenEngine
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.engine.rollout.vllm_engine import VLLMEngine
from rllm.errors import TokenTraceError
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import ScriptedTokenEngine, ScriptedTokenServer
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.tokens.renderer import ChatRenderer
from rllm.tokens.trace import TokenTrace

SYSTEM = "Answer with \\boxed{}."
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
THOUGHT = "<think>\nI need the lookup tool.\n</think>\n\n"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return FAMILIES["qwen3"].tokenizer()


class Tools:
    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        def lookup(key: str) -> dict:
            """Look a key up; answers with a text block and a json block."""
            self.calls.append(key)
            return {"status": "success", "content": [{"text": f"value of {key}"}, {"json": {"key": key, "n": 7}}]}

        self.tools = [lookup]


def think_call_then_answer(prompt: str) -> str:
    """Turn 1: reason, then call the tool; turn 2 (after a tool response): answer."""
    if "<tool_response>" not in prompt.rsplit("<|im_start|>user", 1)[-1]:
        return THOUGHT + CALL
    return "<think>\nGot it.\n</think>\n\nThe answer is \\boxed{7}."


def _segments(trace: TokenTrace, kind: str) -> list[list[int]]:
    return [trace.token_ids[s.start : s.end] for s in trace.segments if s.kind == kind]


async def _run(engine: TokenEngine, tools: Tools, *prompts: str) -> StrandsAgent:
    agent = StrandsAgent(RLLMModel(engine), tools=tools.tools, system_prompt=SYSTEM)
    for prompt in prompts:
        await agent.invoke_async(prompt)
    return agent


async def test_trace_is_exactly_what_was_sampled(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, think_call_then_answer)
    tools = Tools()

    agent = await _run(engine, tools, "find alpha")

    trace = agent.trajectory.token_trace
    steps = agent.trajectory.steps
    end = engine.renderer.probe.end_of_turn_id
    assert tools.calls == ["alpha"] and len(steps) == 2
    trace.check()
    # The mask covers exactly the sampled tokens, which are the scripted texts + end of turn.
    sampled = _segments(trace, "sampled")
    assert sampled == [tokenizer.encode(THOUGHT + CALL, add_special_tokens=False) + [end],
                       steps[1].model_output.completion_ids]
    assert sum(trace.loss_mask) == sum(len(s) for s in sampled)
    assert [i for i, m in zip(trace.token_ids, trace.loss_mask) if m] == sampled[0] + sampled[1]
    # Logprobs line up with the sampled tokens and are zero elsewhere.
    assert [lp for lp, m in zip(trace.logprobs, trace.loss_mask) if m] == (
        steps[0].model_output.logprobs + steps[1].model_output.logprobs)
    assert all(lp == 0.0 for lp, m in zip(trace.logprobs, trace.loss_mask) if not m)
    # Each call's prompt is the previous prompt + the sampled tokens + the rendered delta.
    first, second = engine.prompts
    assert first == engine.renderer.prompt_ids(steps[0].messages, steps[0].tools)
    assert second[: len(first) + len(sampled[0])] == first + sampled[0]
    assert trace.token_ids == second + sampled[1]
    # The tool result is context (mask 0) and carries both of its blocks.
    (delta,) = _segments(trace, "context")
    delta_text = tokenizer.decode(delta, skip_special_tokens=False)
    assert delta_text.startswith("\n<|im_start|>user\n<tool_response>\nvalue of alpha\n")
    assert json.loads(delta_text.split("value of alpha\n", 1)[1].split("\n</tool_response>")[0]) == {"key": "alpha", "n": 7}
    assert delta_text.endswith("<|im_start|>assistant\n")
    # The parsed output keeps reasoning apart and gives the call an episode-unique id.
    assert steps[0].model_output.reasoning == "I need the lookup tool."
    assert steps[0].tool_calls[0].input == {"key": "alpha"}
    verl = trace.to_verl()
    assert verl["prompt_ids"] == first and len(verl["response_ids"]) == len(verl["response_mask"]) == len(
        verl["response_logprobs"])
    assert TokenTrace.model_validate_json(trace.model_dump_json()) == trace


async def test_rerendering_drifts_on_qwen3_template_but_the_trace_does_not(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, think_call_then_answer, audit=True)
    tools = Tools()

    agent = await _run(engine, tools, "find alpha", "and again?")  # a second user turn

    trace = agent.trajectory.token_trace
    last = agent.trajectory.steps[-1]
    rerendered = engine.renderer.prompt_ids(last.messages, last.tools)
    tito_prompt = last.model_output.prompt_ids
    # The re-render drops the earlier <think> blocks, so it is not what the model saw.
    think_id = tokenizer.convert_tokens_to_ids("<think>")
    assert len(agent.trajectory.steps) == 4  # call, answer, (second user turn) call, answer
    assert tito_prompt.count(think_id) == 3 and rerendered.count(think_id) == 1
    assert rerendered != tito_prompt
    assert engine.audit_mismatches >= 1
    # The trace still holds every sampled token, in order.
    for step in agent.trajectory.steps:
        start = len(step.model_output.prompt_ids)
        assert trace.token_ids[start : start + len(step.model_output.completion_ids)] == step.model_output.completion_ids


async def test_prefilled_think_with_a_draft_call_does_not_run_it(tokenizer) -> None:
    prefilling = FAMILIES["qwen3_5_think"].tokenizer()  # Qwen3.5 opens <think> in its generation prompt
    draft = 'maybe <tool_call>\n{"name": "lookup", "arguments": {"key": "draft"}}\n</tool_call> no.\n</think>\n\nNo tool needed: \\boxed{1}'
    engine = ScriptedTokenEngine(prefilling, lambda prompt: draft)
    assert engine.renderer.probe.think_prefilled
    tools = Tools()

    agent = await _run(engine, tools, "anything")

    assert tools.calls == []
    output = agent.trajectory.steps[0].model_output
    assert output.tool_calls == [] and "draft" in output.reasoning and output.text.endswith("\\boxed{1}")


async def test_malformed_generated_call_is_returned_as_tool_error(tokenizer) -> None:
    def broken_then_answer(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "ok \\boxed{0}"
        return '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha",}}\n</tool_call>'

    tools = Tools()
    agent = await _run(ScriptedTokenEngine(tokenizer, broken_then_answer), tools, "go")

    assert tools.calls == []
    step = agent.trajectory.steps[0]
    assert step.tool_calls[0].error and agent.trajectory.num_tool_errors == 1
    assert step.observation[0]["content"].startswith("Error: invalid")


async def test_reset_clears_the_token_trace(tokenizer) -> None:
    engine = ScriptedTokenEngine(tokenizer, think_call_then_answer)
    agent = await _run(engine, Tools(), "find alpha")
    first = agent.trajectory.token_trace.model_copy(deep=True)

    agent.reset()
    await agent.invoke_async("find alpha")

    assert agent.trajectory.token_trace == first


def test_trace_invariants_fail_loudly() -> None:
    trace = TokenTrace()
    with pytest.raises(TokenTraceError, match="before any prompt"):
        trace.add_sampled([1], [-0.1])
    trace.add_prompt([1, 2])
    with pytest.raises(TokenTraceError, match="2 sampled tokens but 1 logprobs"):
        trace.add_sampled([3, 4], [-0.1])
    with pytest.raises(TokenTraceError, match="without logprobs"):
        trace.add_sampled([3], None)
    with pytest.raises(TokenTraceError, match="first and only once"):
        trace.add_prompt([5])


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
async def test_http_token_engines_send_token_ids(tokenizer, backend: str) -> None:
    end = build_engine_probe(tokenizer)
    server = ScriptedTokenServer(tokenizer, end, think_call_then_answer, fail_first=1).start()
    try:
        fast = {"backoff_initial": 0.01, "backoff_max": 0.02}
        engine = (SGLangEngine(server.root_url, tokenizer, **fast) if backend == "sglang"
                  else VLLMEngine(server.base_url, "tiny", tokenizer, **fast))
        tools = Tools()
        agent = await _run(engine, tools, "find alpha")
    finally:
        server.stop()

    trace = agent.trajectory.token_trace
    requests = server.token_requests
    assert len(requests) == 3 and tools.calls == ["alpha"]  # one retried 500, then two turns
    prompts = [r["input_ids"] if backend == "sglang" else r["prompt"] for r in requests[1:]]
    assert prompts == [s.model_output.prompt_ids for s in agent.trajectory.steps]
    assert trace.token_ids == prompts[1] + agent.trajectory.steps[1].model_output.completion_ids
    assert len({r["_headers"]["x-session-id"] for r in requests}) == 1
    if backend == "sglang":
        assert [r["logprob_start_len"] for r in requests[1:]] == [len(p) - 1 for p in prompts]
        assert requests[1]["sampling_params"]["skip_special_tokens"] is False
    else:
        assert requests[1]["return_token_ids"] is True and requests[1]["logprobs"] == 1


def build_engine_probe(tokenizer: Any) -> int:
    return ChatRenderer(tokenizer).probe.end_of_turn_id


async def test_strands_agent_runs_on_tiny_qwen3_with_exact_logprobs(tokenizer) -> None:
    import torch

    model = build_tiny_qwen3(tokenizer)
    engine = TransformersEngine(model, tokenizer, temperature=1.0, max_tokens=12, seed=0)
    tools = Tools()
    agent = StrandsAgent(RLLMModel(engine), tools=tools.tools, system_prompt=SYSTEM)

    try:
        await agent.invoke_async("find alpha")
    except Exception as error:  # a random model may run out of tokens: the trace is still complete
        assert type(error).__name__ == "MaxTokensReachedException", error

    trace = agent.trajectory.token_trace
    trace.check()
    step = agent.trajectory.steps[0]
    assert trace.token_ids[: trace.prompt_length] == engine.renderer.prompt_ids(step.messages, step.tools)
    assert 0 < sum(trace.loss_mask) <= 12 * len(agent.trajectory.steps)
    # Teacher-forcing the trace reproduces the logprob reported for every sampled token.
    with torch.inference_mode():
        logits = model(torch.tensor([trace.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)
    for position, (token, mask, logprob) in enumerate(zip(trace.token_ids, trace.loss_mask, trace.logprobs)):
        if mask:
            assert math.isclose(logprob, expected[position - 1, token].item(), abs_tol=1e-3)


def test_drift_audit_shows_zero_for_tito_and_drift_for_rerendering() -> None:
    """On the real Qwen tokenizer and Qwen3's shipped template: TITO never drifts, re-rendering does."""
    import asyncio
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[4] / "scripts" / "drift_audit.py"
    spec = importlib.util.spec_from_file_location("drift_audit", path)
    audit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit)

    results = asyncio.run(audit.audit_family("qwen3", 4, seed=0))

    assert [r["tito_diff"] for r in results] == [0, 0, 0, 0]
    # Odd rollouts get a second user turn, after which Qwen3's template drops the earlier <think> blocks.
    assert [r["rerender_diff"] > 0 for r in results] == [False, True, False, True]
    summary = audit.summarize("qwen3", results)
    assert summary["tito_differing_tokens"] == 0 and summary["rerender_differing_tokens"] > 0
