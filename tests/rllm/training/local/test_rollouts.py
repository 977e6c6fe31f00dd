"""Local rollouts raise on what must not be trained: an aborted generation, a cancelled run.

A local run has no other rollouts to fall back on. Real Strands agent and tool, Qwen's real
tokenizer and Qwen3's shipped template, a scripted token policy.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import ToolContext, tool

from rllm.errors import GenerationAbortedError, RolloutCancelledError
from rllm.integrations.strands import Budget
from rllm.testing.chat_templates import FAMILIES
from rllm.testing.scripted_tokens import Cut, ScriptedTokenEngine
from rllm.training.local import RolloutRequest, run_rollouts

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>'
LOOKUPS: list[str] = []


@tool(context=True)
def lookup(key: str, tool_context: ToolContext) -> str:
    """Look a key up; the key "stop" cancels the run."""
    LOOKUPS.append(key)
    if key == "stop":
        tool_context.agent.cancel()
    return f"{key} holds 7"


async def _run(script: Any) -> None:
    engine = ScriptedTokenEngine(FAMILIES["qwen3"].tokenizer(), script)
    await run_rollouts(engine, [RolloutRequest("What does alpha hold?", "g0", {})], tools=[lookup],
                       system_prompt="Answer in \\boxed{}.", budget=Budget(), response_length=512)


async def test_an_aborted_generation_raises_and_its_cut_call_never_runs() -> None:
    LOOKUPS.clear()
    with pytest.raises(GenerationAbortedError, match="aborted the generation"):
        await _run(lambda prompt: Cut(CALL))
    assert LOOKUPS == []


async def test_a_cancelled_rollout_raises() -> None:
    LOOKUPS.clear()
    with pytest.raises(RolloutCancelledError, match="cancelled"):
        await _run(lambda prompt: "\\boxed{7}" if "<tool_response>" in prompt else CALL.replace("alpha", "stop"))
    assert LOOKUPS == ["stop"]
