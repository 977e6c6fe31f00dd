"""Faults on the own-client door end a rollout as they end the same agent on ``RLLMModel``.

Faults are injected from outside the code under test: an engine subclass that fails its n-th
``_generate`` (a throttle, a gone backend, a context overflow), a tool that sleeps past the
rollout's timeout or raises a ``ConfigurationError``. The agents are unchanged ``strands.Agent``s on
Strands' ``OpenAIModel`` over the real ``openai`` client (its default retries) talking HTTP to a
``PolicyServer`` on 127.0.0.1, and the same agents on ``RLLMModel``; the engine is
``MessageScriptedEngine`` on Qwen3's real tokenizer and template.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fixtures.strands_agents import SYSTEM
from strands import Agent, ModelRetryStrategy, tool
from strands.models.openai import OpenAIModel

from rllm.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    EngineThrottledError,
    EngineUnavailableError,
)
from rllm.integrations.strands import RLLMModel, record, run_served_rollout
from rllm.integrations.strands.rollout import FinishedRollout, run_rollout
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.tracing import PolicyServer
from rllm.types import TerminationReason

QUESTION = "What is the capital of France?"


def _script(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Call ``step`` ``steps`` times, one call a turn, then answer."""
    done = sum(1 for m in messages if m.get("role") == "tool")
    if done < steps:
        return {"content": "", "tool_calls": [{"id": f"call_{done}", "type": "function",
                                               "function": {"name": "step", "arguments": json.dumps({"n": done + 1})}}]}
    return {"content": "It is \\boxed{Paris}."}


class _FailingAt(MessageScriptedEngine):
    """Raises ``errors[i]`` at its i-th ``_generate`` (``None``: samples), recording what each call was given."""

    def __init__(self, errors: list[BaseException | None], steps: int = 1, **kwargs: Any) -> None:
        family = FAMILIES["qwen3"]
        super().__init__(family.tokenizer(), lambda m: _script(m, steps), tool_parser=family.tool_parser,
                         chat_template_kwargs=family.chat_template_kwargs, **kwargs)
        self.errors = list(errors)
        self.calls = 0
        self.sampling: list[dict[str, Any]] = []

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: Any) -> Any:
        index, self.calls = self.calls, self.calls + 1
        self.sampling.append(dict(sampling, max_new_tokens=max_new_tokens))
        if index < len(self.errors) and self.errors[index] is not None:
            raise self.errors[index]
        return await super()._generate(prompt_ids, max_new_tokens, sampling, session)


def _step_tool(action: str = "answer") -> Any:
    """The ``step`` tool; its second step sleeps past any rollout timeout, or raises a ``ConfigurationError``."""

    @tool
    async def step(n: int) -> str:
        """Take step n."""
        if action == "sleep" and n == 2:
            await asyncio.sleep(30)
        if action == "misconfigured" and n == 2:
            raise ConfigurationError("the step tool has no backend configured")
        return f"step {n} done: " + " ".join(f"w{i}" for i in range(300))  # long: an overflow truncates it

    return step


@pytest.fixture
async def server() -> AsyncIterator[PolicyServer]:
    policy = await PolicyServer().start()
    yield policy
    await policy.stop()


async def _on_rllm_model(engine: MessageScriptedEngine, tool_action: str = "answer",
                         timeout_s: float | None = None) -> FinishedRollout:
    agent = Agent(model=RLLMModel(engine), tools=[_step_tool(tool_action)], system_prompt=SYSTEM,
                  callback_handler=None, retry_strategy=ModelRetryStrategy(initial_delay=0))
    return await run_rollout(agent, QUESTION, recorder=record(agent), timeout_s=timeout_s)


async def _on_own_client(server: PolicyServer, engine: MessageScriptedEngine, tool_action: str = "answer",
                         timeout_s: float | None = None, params: dict[str, Any] | None = None,
                         ) -> FinishedRollout:
    model = OpenAIModel(client=server.endpoint().async_client(), model_id=server.model, params=params)
    agent = Agent(model=model, tools=[_step_tool(tool_action)], system_prompt=SYSTEM, callback_handler=None)
    return await run_served_rollout(agent, QUESTION, server, engine, recorder=record(agent), timeout_s=timeout_s)


async def test_a_throttle_retried_by_strands_continues_the_sample_it_retried() -> None:
    engine = _FailingAt([None, EngineThrottledError("busy", url="http://rollout", cause="429")])
    finished = await _on_rllm_model(engine)

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "It is \\boxed{Paris}."
    assert engine.calls == 3  # Strands retried the throttled call
    (session,) = finished.token_sessions
    assert len(finished.samples) == 1 and finished.samples == [t.to_verl(None) for t in session.samples]
    assert (session.calls, session.rewritten_calls) == (2, 0)  # the failed call is no call


async def test_a_503_retried_by_the_openai_client_continues_the_sample_it_retried(server: PolicyServer) -> None:
    engine = _FailingAt([None, EngineUnavailableError("restarting", url="http://rollout", cause="503")])
    finished = await _on_own_client(server, engine)

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "It is \\boxed{Paris}."
    assert engine.calls == 3  # the client retried the 503 itself
    (session,) = finished.token_sessions
    assert len(finished.samples) == 1 and finished.samples == [t.to_verl(None) for t in session.samples]
    assert (session.calls, session.rewritten_calls) == (2, 0)


@pytest.mark.parametrize(("action", "reason"), [("sleep", TerminationReason.TIMEOUT),
                                                ("misconfigured", TerminationReason.ERROR)])
async def test_a_recovered_overflow_never_decides_how_a_later_failure_ends(
        server: PolicyServer, action: str, reason: TerminationReason) -> None:
    # The second call overflows once; Strands' default SlidingWindowConversationManager reduces the history and
    # the retry calls step 2, which then sleeps past the rollout's timeout or raises a ConfigurationError.
    def engine() -> _FailingAt:
        return _FailingAt([None, ContextLengthExceededError("the prompt fills the context")], steps=2)

    # Only the sleeping tool is meant to meet the timeout; a misconfigured tool must end the rollout as an
    # error however slow a busy machine is (1.5 s once timed the own-client door out before its tool ran).
    timeout_s = 3.0 if action == "sleep" else 60.0
    on_model = await _on_rllm_model(engine(), action, timeout_s=timeout_s)
    own = await _on_own_client(server, engine(), action, timeout_s=timeout_s)

    assert (own.end.reason, on_model.end.reason) == (reason, reason), (own.end, own.error, on_model.end)
    assert type(own.error) is type(on_model.error)
    if reason is TerminationReason.ERROR:
        for finished in (own, on_model):
            with pytest.raises(ConfigurationError, match="the step tool has no backend configured"):
                finished.raise_if_unexpected()  # what training does: the run stops with its cause
