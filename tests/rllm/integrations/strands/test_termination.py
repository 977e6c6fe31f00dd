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

import httpx
import openai
import pytest
from strands import tool
from strands.types.exceptions import ContextWindowOverflowException, EventLoopException

from rllm.engine.rollout import OpenAIEngine
from rllm.errors import (
    AbortUnsupportedError,
    ConfigurationError,
    ContextLengthExceededError,
    EngineError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    GenerationAbortedError,
    ResponseBudgetExhaustedError,
    TemplateError,
    ToolBackendError,
)
from rllm.integrations.strands import RLLMModel, StrandsAgent, describe_failure, termination_reason_for
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
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


def _overflow(error: BaseException) -> BaseException:
    """``error`` as ``RLLMModel`` hands it to Strands: a ``ContextWindowOverflowException`` caused by it."""
    try:
        try:
            raise error
        except Exception as inner:
            raise ContextWindowOverflowException(str(inner)) from inner
    except ContextWindowOverflowException as outer:
        return outer


_REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


@pytest.mark.parametrize(("error", "reason"), [
    (EngineUnavailableError("down"), TerminationReason.ENGINE_ERROR),
    (EngineThrottledError("429"), TerminationReason.ENGINE_ERROR),
    (_wrapped(EngineUnavailableError("aborted")), TerminationReason.ENGINE_ERROR),
    (_wrapped(GenerationAbortedError("the server cut the generation")), TerminationReason.ENGINE_ERROR),
    (AbortUnsupportedError("cancel() cannot abort verl's request"), TerminationReason.ERROR),
    (ToolBackendError("index down"), TerminationReason.TOOL_BACKEND_ERROR),
    (asyncio.TimeoutError(), TerminationReason.TIMEOUT),
    (ContextLengthExceededError("too long"), TerminationReason.CONTEXT_OVERFLOW),
    (_overflow(ResponseBudgetExhaustedError("response_length used up")), TerminationReason.MAX_TOKENS),
    (_overflow(ContextLengthExceededError("too long")), TerminationReason.CONTEXT_OVERFLOW),
    (_wrapped(asyncio.TimeoutError()), TerminationReason.TIMEOUT),
    (TypeError("can only concatenate str (not \"list\") to str"), TerminationReason.ERROR),
    (_wrapped(TemplateError("the chat template re-renders earlier turns")), TerminationReason.ERROR),
    (ConfigurationError("HTTP 401"), TerminationReason.ERROR),
    (EngineRequestError("400"), TerminationReason.ERROR),
    (EngineError("untyped engine failure"), TerminationReason.ERROR),
    (ConnectionError("an untyped connection error"), TerminationReason.ERROR),
    # What Strands' streaming OpenAIModel raises unchanged (an agent on its own client): the server failed.
    (_wrapped(openai.APIConnectionError(request=_REQUEST)), TerminationReason.ENGINE_ERROR),
    (_wrapped(openai.APITimeoutError(request=_REQUEST)), TerminationReason.TIMEOUT),
    (openai.InternalServerError("502", response=httpx.Response(502, request=_REQUEST), body=None),
     TerminationReason.ENGINE_ERROR),
    (openai.BadRequestError("400", response=httpx.Response(400, request=_REQUEST), body=None), TerminationReason.ERROR),
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


# ------------------------------------------------ one classifier, whichever consumer runs the rollout
# The same failure, raised at the same place (the token engine's second generation, or the tool),
# must end the rollout with the same reason in the batch runner (AgentWorkflowEngine over
# StrandsWorkflow), the verl agent loop and the local trainer. The verl loop and the local trainer
# raise what is not theirs to keep (a bug; for the local trainer also infrastructure): the reason
# of a raised error is the classifier's reading of it.

_ENGINE_FAILURES = [
    (ResponseBudgetExhaustedError("the response already fills rollout.response_length"), TerminationReason.MAX_TOKENS),
    (ContextLengthExceededError("the prompt fills the context"), TerminationReason.CONTEXT_OVERFLOW),
    (EngineUnavailableError("the rollout server is down"), TerminationReason.ENGINE_ERROR),
    (EngineThrottledError("429 after every retry"), TerminationReason.ENGINE_ERROR),
    (asyncio.TimeoutError(), TerminationReason.TIMEOUT),
    (TemplateError("the chat template re-renders earlier turns"), TerminationReason.ERROR),
    (TypeError("can only concatenate str (not \"list\") to str"), TerminationReason.ERROR),
]
_TOOL_FAILURES = [
    ("backend", TerminationReason.TOOL_BACKEND_ERROR),
    ("auth", TerminationReason.ERROR),
    (None, TerminationReason.FINISHED),
]


def _fail_on_second_call(engine: Any, error: BaseException | None) -> Any:
    """``engine`` whose second generation raises ``error`` (the first asks for a tool, so a trace exists)."""
    if error is None:
        return engine
    generate, calls = engine._generate, []

    async def _generate(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise error
        return await generate(*args, **kwargs)

    engine._generate = _generate
    return engine


async def _through_the_batch_runner(tokenizer: Any, error: BaseException | None, fail_with: str | None) -> str:
    from fixtures.verl_loop import GROUND_TRUTH, QUESTION, SYSTEM, lookup_call, lookup_tools, turns_script

    from rllm.offline.scripted_tokens import ScriptedTokenEngine
    from rllm.rewards import RewardSearchFn
    from rllm.workflows import StrandsWorkflow
    from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine

    engine = _fail_on_second_call(
        ScriptedTokenEngine(tokenizer, turns_script(lookup_call("France"), "It is \\boxed{Paris}.")), error)
    runner = AgentWorkflowEngine(StrandsWorkflow, {"tools": lookup_tools(fail_with), "system_prompt": SYSTEM,
                                                   "reward_fn": RewardSearchFn()},
                                 engine, n_parallel_tasks=1, retry_limit=0, progress=False, max_same_errors=None,
                                 max_infra_failure_share=None)
    (episode,) = await runner.execute_tasks([{"id": "q0", "question": QUESTION, "answer": GROUND_TRUTH}])
    return episode.termination_reason.value


async def _through_the_verl_loop(tokenizer: Any, error: BaseException | None, fail_with: str | None) -> str:
    from fixtures.verl_loop import SAMPLING, FakeServerManager, build_loop, lookup_call, row, turns_script

    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "It is \\boxed{Paris}."))
    loop, _ = build_loop(tokenizer, server, fail_with=fail_with)
    build_engine = loop.build_engine
    loop.build_engine = lambda sampling: _fail_on_second_call(build_engine(sampling), error)  # type: ignore[method-assign]
    try:
        (output,) = await loop.rollout(dict(SAMPLING), **row())
    except Exception as raised:  # noqa: BLE001 - the loop raises what is not a policy outcome or infrastructure
        return termination_reason_for(raised).value
    return output.extra_fields["termination_reason"]


async def _through_the_local_trainer(tokenizer: Any, error: BaseException | None, fail_with: str | None) -> str:
    from fixtures.verl_loop import QUESTION, SYSTEM, lookup_call, lookup_tools, turns_script

    from rllm.integrations.strands import Budget
    from rllm.offline.scripted_tokens import ScriptedTokenEngine
    from rllm.training.local import RolloutRequest, run_rollouts

    engine = _fail_on_second_call(
        ScriptedTokenEngine(tokenizer, turns_script(lookup_call("France"), "It is \\boxed{Paris}.")), error)
    try:
        (rollout,) = await run_rollouts(engine, [RolloutRequest(QUESTION, "g0", {"max_tokens": 64})],
                                        tools=lookup_tools(fail_with), system_prompt=SYSTEM, budget=Budget(),
                                        response_length=1024)
    except Exception as raised:  # noqa: BLE001 - the local trainer raises infrastructure and bugs
        return termination_reason_for(raised).value
    return rollout.reason.value


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    from rllm.offline.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.mark.parametrize(("failure", "reason"), [(e, r) for e, r in _ENGINE_FAILURES] + [
    (f"tool:{f}", r) for f, r in _TOOL_FAILURES], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
async def test_every_consumer_gives_the_same_reason(tiny_tokenizer: Any, failure: Any, reason: TerminationReason) -> None:
    error, fail_with = (None, failure.split(":", 1)[1]) if isinstance(failure, str) else (failure, None)
    fail_with = None if fail_with == "None" else fail_with
    reasons = {
        "batch runner": await _through_the_batch_runner(tiny_tokenizer, error, fail_with),
        "verl loop": await _through_the_verl_loop(tiny_tokenizer, error, fail_with),
        "local trainer": await _through_the_local_trainer(tiny_tokenizer, error, fail_with),
    }
    assert reasons == dict.fromkeys(reasons, reason.value)


async def test_a_stock_openai_model_whose_server_is_down_ends_as_infrastructure() -> None:
    # Strands' streaming OpenAIModel raises the OpenAI client's connection error unchanged.
    from strands import Agent
    from strands.models.openai import OpenAIModel

    from rllm.integrations.strands import record
    from rllm.integrations.strands.rollout import run_rollout
    from rllm.processes import free_port

    model = OpenAIModel(client_args={"base_url": f"http://127.0.0.1:{free_port()}/v1", "api_key": "x",
                                     "max_retries": 0}, model_id="m")
    agent = Agent(model=model, callback_handler=None)
    finished = await run_rollout(agent, "hi", recorder=record(agent))
    assert finished.end.reason is TerminationReason.ENGINE_ERROR and finished.end.infra_failure
    assert "APIConnectionError" in (finished.end.failure or "")
