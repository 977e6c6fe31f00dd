"""How a Strands agent run classifies what ended it: typed exceptions, never text.

``termination_reason_for`` calls typed infrastructure failures infrastructure and everything
untyped an ``ERROR``; ``ToolFailureHook`` (in every ``StrandsAgent``) reads the exception a tool
raised from ``AfterToolCallEvent``: a backend failure ends the episode as ``tool_backend_error``,
a configuration error is raised after its tool round. A real Strands loop against a scripted
OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from strands import tool
from strands.types.exceptions import EventLoopException

from rllm.engine.rollout import OpenAIEngine
from rllm.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    EngineError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    TemplateError,
    ToolBackendError,
)
from rllm.integrations.strands import RLLMModel, StrandsAgent, describe_failure, termination_reason_for
from rllm.testing.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.types import TerminationReason


def _wrapped(error: BaseException) -> BaseException:
    """``error`` as Strands' event loop re-raises it."""
    try:
        try:
            raise error
        except Exception as inner:
            raise EventLoopException(inner, {}) from inner
    except EventLoopException as outer:
        return outer


@pytest.mark.parametrize(("error", "reason"), [
    (EngineUnavailableError("down"), TerminationReason.ENGINE_ERROR),
    (EngineThrottledError("429"), TerminationReason.ENGINE_ERROR),
    (_wrapped(EngineUnavailableError("aborted")), TerminationReason.ENGINE_ERROR),
    (ToolBackendError("index down"), TerminationReason.TOOL_BACKEND_ERROR),
    (asyncio.TimeoutError(), TerminationReason.TIMEOUT),
    (ContextLengthExceededError("too long"), TerminationReason.CONTEXT_OVERFLOW),
    (TypeError("can only concatenate str (not \"list\") to str"), TerminationReason.ERROR),
    (_wrapped(TemplateError("the chat template re-renders earlier turns")), TerminationReason.ERROR),
    (ConfigurationError("HTTP 401"), TerminationReason.ERROR),
    (EngineRequestError("400"), TerminationReason.ERROR),
    (EngineError("untyped engine failure"), TerminationReason.ERROR),
    (ConnectionError("an untyped connection error"), TerminationReason.ERROR),
])
def test_only_typed_infrastructure_failures_are_infrastructure(error: BaseException, reason: TerminationReason) -> None:
    assert termination_reason_for(error) is reason
    assert reason.is_infrastructure_failure == (reason in (TerminationReason.ENGINE_ERROR,
                                                           TerminationReason.TOOL_BACKEND_ERROR,
                                                           TerminationReason.TIMEOUT))


def test_describe_failure_looks_through_the_event_loop_wrapper() -> None:
    assert describe_failure(_wrapped(TypeError("bad operand"))) == "TypeError: bad operand"
    assert describe_failure(ValueError("x")) == "ValueError: x"


CALLS: list[str] = []


@tool
def fetch(key: str) -> str:
    """Fetch a record.

    Args:
        key: Which record.
    """
    CALLS.append(key)
    if key == "down":
        raise ToolBackendError("record store at 10.0.0.7 timed out after 3 attempts")
    if key == "denied":
        raise ConfigurationError("record store rejected the token (HTTP 403): set RECORDS_TOKEN")
    if key == "typo":
        raise ValueError("no record named 'typo'")
    return f"record {key}: 42"


def _fetch_then_answer(key: str):
    def script(body: dict[str, Any]) -> ScriptedReply:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return ScriptedReply(tool_calls=[ScriptedToolCall("fetch", json.dumps({"key": key}))])
        return ScriptedReply(content="done")

    return script


def _agent(server: Any) -> StrandsAgent:
    return StrandsAgent(RLLMModel(OpenAIEngine(model="scripted", base_url=server.base_url, max_retries=0)),
                        tools=[fetch], system_prompt="Fetch, then answer.")


async def test_a_tool_backend_failure_ends_the_episode_as_infrastructure(serve) -> None:
    server = serve(_fetch_then_answer("down"))
    agent = _agent(server)
    await agent.invoke_async("Fetch it.")
    assert agent.termination_reason is TerminationReason.TOOL_BACKEND_ERROR
    assert len(server.requests) == 1  # the turn ended after the tool round: no generation spent on it
    (step,) = agent.trajectory.steps
    assert "ToolBackendError - record store at 10.0.0.7 timed out" in json.dumps(step.observation)  # the model reads it
    assert agent.tool_failures.description == ("tool 'fetch' failed: ToolBackendError: record store at 10.0.0.7 "
                                               "timed out after 3 attempts")
    agent.reset()
    assert agent.termination_reason is None and agent.tool_failures.error is None


async def test_a_tool_configuration_error_is_raised_after_its_round(serve) -> None:
    server = serve(_fetch_then_answer("denied"))
    agent = _agent(server)
    with pytest.raises(ConfigurationError, match=r"HTTP 403.*RECORDS_TOKEN"):
        await agent.invoke_async("Fetch it.")
    assert agent.termination_reason is TerminationReason.ERROR and len(server.requests) == 1
    (step,) = agent.trajectory.steps
    assert "HTTP 403" in json.dumps(step.observation)  # the round is recorded before the run raises
    # The synchronous entry point raises it too.
    agent.reset()
    with pytest.raises(ConfigurationError):
        await asyncio.to_thread(agent, "Fetch it.")


async def test_any_other_tool_exception_is_the_policys_and_the_run_goes_on(serve) -> None:
    server = serve(_fetch_then_answer("typo"))
    agent = _agent(server)
    await agent.invoke_async("Fetch it.")
    assert agent.termination_reason is TerminationReason.FINISHED and len(server.requests) == 2
    assert "no record named 'typo'" in json.dumps(agent.trajectory.steps[0].observation)


async def test_configured_exception_classes_count_as_backend_failures(serve) -> None:
    server = serve(_fetch_then_answer("typo"))
    agent = StrandsAgent(RLLMModel(OpenAIEngine(model="scripted", base_url=server.base_url, max_retries=0)),
                         tools=[fetch], infra_exceptions=(ValueError,))
    await agent.invoke_async("Fetch it.")
    assert agent.termination_reason is TerminationReason.TOOL_BACKEND_ERROR and len(server.requests) == 1
