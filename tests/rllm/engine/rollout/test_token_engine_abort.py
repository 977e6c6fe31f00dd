"""A generation the backend aborted is an infrastructure failure on every engine, never the policy's answer.

The held-out case: the cut text is a complete, parseable call to a tool with an effect. It must
not run, the rollout must end ``ENGINE_ERROR`` with nothing of the cut turn in its token trace, and
evaluation must record it unscored (retried as infrastructure), never score it. Real pieces:
Qwen's real tokenizer with Qwen3's shipped template, SGLang's and vLLM's token APIs and an
OpenAI-compatible chat endpoint served over HTTP on 127.0.0.1 by the repo's scripted servers, and
the real ``TransformersEngine`` on a tiny Qwen3 forced to write the call, aborted with
``engine.abort()`` (what verl's ``abort_all_requests`` does) right after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from strands import tool

from rllm.engine.rollout import OpenAIEngine
from rllm.engine.rollout.sglang_engine import SGLangEngine
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.engine.rollout.vllm_engine import VLLMEngine
from rllm.errors import GenerationAbortedError, exception_chain
from rllm.integrations.strands import NonStreamingOpenAIModel
from rllm.integrations.strands.rollout import run_rollout
from rllm.integrations.strands.runner import build_agent
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from rllm.offline.scripted_tokens import Cut, ScriptedTokenServer
from rllm.offline.tiny_models import ForcedCausalLM, build_tiny_qwen3
from rllm.parser import get_tool_parser
from rllm.rewards.base import RewardOutput
from rllm.tokens.renderer import ChatRenderer
from rllm.types import TerminationReason
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow

SYSTEM = "Answer with \\boxed{}."
CALL = '<tool_call>\n{"name": "transfer", "arguments": {"to": "mallory", "amount": 100}}\n</tool_call>'
BACKENDS = ["sglang", "vllm", "transformers", "openai", "non_streaming_openai"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return FAMILIES["qwen3"].tokenizer()


@pytest.fixture(scope="module")
def tiny_qwen3(tokenizer: Any) -> Any:
    return build_tiny_qwen3(tokenizer)


class Bank:
    """A tool with an effect, recording every call it runs."""

    def __init__(self) -> None:
        self.transfers: list[tuple[str, int]] = []

        @tool
        def transfer(to: str, amount: int) -> str:
            """Transfer money to an account."""
            self.transfers.append((to, amount))
            return "done"

        self.tools = [transfer]


def cut_call_then_answer(prompt: str) -> str | Cut:
    """Turn 1: the call, cut by the server (abort); had it run, turn 2 answers."""
    return "\\boxed{done}" if "<tool_response>" in prompt else Cut(CALL)


def _chat_script(body: dict[str, Any]) -> ScriptedReply:
    if any(m["role"] == "tool" for m in body["messages"]):
        return ScriptedReply(content="\\boxed{done}")
    return ScriptedReply(tool_calls=[ScriptedToolCall("transfer", '{"to": "mallory", "amount": 100}')],
                         finish_reason="abort")


@contextlib.asynccontextmanager
async def policy(backend: str, tokenizer: Any, tiny_qwen3: Any) -> AsyncIterator[Any]:
    """An engine (or Strands model) whose first generation is ``CALL``, aborted by its backend."""
    fast = {"backoff_initial": 0.01, "backoff_max": 0.02}
    if backend in ("sglang", "vllm"):
        server = ScriptedTokenServer(tokenizer, ChatRenderer(tokenizer).probe.end_of_turn_id,
                                     cut_call_then_answer).start()
        try:
            yield (SGLangEngine(server.root_url, tokenizer, **fast) if backend == "sglang"
                   else VLLMEngine(server.base_url, "tiny", tokenizer, **fast))
        finally:
            server.stop()
    elif backend == "transformers":
        engine = TransformersEngine(tiny_qwen3, tokenizer, max_batch_size=1, temperature=0.0, max_tokens=200)
        newline = tokenizer.encode("\n", add_special_tokens=False)[0]
        engine.model = ForcedCausalLM(tiny_qwen3, tokenizer.encode(CALL, add_special_tokens=False), newline,
                                      on_written=engine.abort)  # abort everything in flight, as verl does
        yield engine
    else:
        with ScriptedOpenAIServer(_chat_script) as server:
            if backend == "openai":
                yield OpenAIEngine(model="scripted", base_url=server.base_url, max_retries=0)
            else:
                yield NonStreamingOpenAIModel(client_args={"base_url": server.base_url, "api_key": "x",
                                                           "max_retries": 0}, model_id="scripted")


def test_the_cut_text_is_a_call_that_would_run() -> None:
    """The premise: what the backends cut parses as a complete call (the embedded engine's cut adds a newline)."""
    for text in (CALL, CALL + "\n"):
        [call] = get_tool_parser("hermes").parse(text).tool_calls
        assert call.name == "transfer" and call.input == {"to": "mallory", "amount": 100}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_aborted_generation_never_runs_its_tool_call_and_ends_as_infrastructure(
        backend: str, tokenizer: Any, tiny_qwen3: Any) -> None:
    bank = Bank()
    async with policy(backend, tokenizer, tiny_qwen3) as model:
        agent = build_agent(model, tools=bank.tools, system_prompt=SYSTEM)
        finished = await run_rollout(agent, "Pay the invoice.")

    assert bank.transfers == []  # the cut call never ran
    assert any(isinstance(e, GenerationAbortedError) for e in exception_chain(finished.error))
    assert finished.end.reason is TerminationReason.ENGINE_ERROR and finished.end.infra_failure
    assert finished.end.final_answer == ""
    assert "abort" in finished.end.failure
    if backend in ("sglang", "vllm", "transformers"):
        # The trace keeps its first prompt and nothing of the cut turn: nothing sampled to train on.
        trace = agent.trajectory.token_trace
        assert [s.kind for s in trace.segments] == ["prompt"]
        assert len(finished.samples) == 1 and finished.samples[0]["response_ids"] == []
    if backend == "transformers":
        assert model.stats.aborted == 1


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "non_streaming_openai"])  # the engines
async def test_evaluation_records_an_aborted_generation_unscored_after_retrying_it(
        backend: str, tokenizer: Any, tiny_qwen3: Any) -> None:
    bank = Bank()
    scored: list[str] = []

    def reward(task: dict[str, Any], answer: str) -> RewardOutput:
        scored.append(answer)
        return RewardOutput(reward=1.0, is_correct=True)

    async with policy(backend, tokenizer, tiny_qwen3) as model:
        runner = AgentWorkflowEngine(
            StrandsWorkflow, {"tools": bank.tools, "system_prompt": SYSTEM, "reward_fn": reward}, model,
            n_parallel_tasks=1, retry_limit=1, retry_backoff=0.0, progress=False, max_infra_failure_share=None)
        [episode] = await runner.execute_tasks([{"id": "t", "question": "Pay the invoice."}])

    assert bank.transfers == [] and scored == []
    assert episode.termination_reason is TerminationReason.ENGINE_ERROR
    assert episode.info["attempts"] == 2  # retried once, as infrastructure is
    assert "abort" in episode.info["error"]
    assert episode.reward == 0.0 and not episode.is_correct
    stats = runner.stats
    assert stats.infrastructure_failures == 1 and stats.scored == 0 and stats.correct == 0

