"""``PolicyServer``: an agent on its own OpenAI client, served the policy by the rollout's token engine.

The agents are unchanged ``strands.Agent``s on Strands' streaming ``OpenAIModel`` or rllm's
``NonStreamingOpenAIModel``, their client rllm's traced one, talking HTTP to a real server on
127.0.0.1; the engine is ``MessageScriptedEngine`` on Qwen's real tokenizer and the templates the
models ship, so a scripted answer is sampled as the model's own template writes it. The reference is
the same agent on ``RLLMModel`` over the same engine (``run_rollout``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fixtures.strands_agents import SYSTEM, ToolLog
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.models.openai import OpenAIModel

from rllm.errors import ConfigurationError, EngineUnavailableError, TokenTraceError
from rllm.integrations.strands import NonStreamingOpenAIModel, RLLMModel, record, run_served_rollout
from rllm.integrations.strands.rollout import run_rollout
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.tracing import PolicyServer, policy_endpoint
from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV
from rllm.tracing.session import SESSION_HEADER
from rllm.types import TerminationReason

QUESTION = "What is the capital of France?"


def _script(messages: list[dict[str, Any]], *, second: str = "quota") -> dict[str, Any]:
    """Look up, then add and ``second`` at once, then answer: tool results with a JSON block and an error status."""
    rounds = sum(1 for m in messages if m.get("role") == "assistant")
    if rounds == 0:
        return {"reasoning_content": "I should look it up.", "content": "",
                "tool_calls": [{"id": "call_0", "type": "function",
                                "function": {"name": "lookup", "arguments": json.dumps({"key": "France"})}}]}
    if rounds == 1:
        return {"content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "call_2", "type": "function", "function": {"name": second, "arguments": '{"user": "me"}'
                                                               if second == "quota" else '{"key": "Paris"}'}}]}
    return {"content": "It is \\boxed{Paris}."}


def _engine(name: str, *, second: str = "quota", **kwargs: Any) -> MessageScriptedEngine:
    family = FAMILIES[name]
    return MessageScriptedEngine(family.tokenizer(), lambda m: _script(m, second=second), tool_parser=family.tool_parser,
                                 chat_template_kwargs=family.chat_template_kwargs, **kwargs)


@pytest.fixture
async def server() -> AsyncIterator[PolicyServer]:
    policy = await PolicyServer().start()
    yield policy
    await policy.stop()


async def _serve(agent: Agent, server: PolicyServer, engine: MessageScriptedEngine) -> Any:
    finished = await run_served_rollout(agent, QUESTION, server, engine, recorder=record(agent))
    (session,) = finished.token_sessions
    return finished, session


def _own_client_agent(server: PolicyServer, model_class: type, **kwargs: Any) -> Agent:
    client = server.endpoint().async_client(max_retries=0)
    return Agent(model=model_class(client=client, model_id=server.model), tools=ToolLog().tools, system_prompt=SYSTEM,
                 callback_handler=None, **kwargs)


@pytest.mark.parametrize("model_class", [OpenAIModel, NonStreamingOpenAIModel])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_coder"])
async def test_an_agent_on_its_own_client_records_the_samples_it_would_on_the_model(
        server: PolicyServer, family: str, model_class: type) -> None:
    # Strands' own OpenAIModel sends a failed tool's result without its error status (rllm's formatter, in
    # RLLMModel and NonStreamingOpenAIModel, keeps it): the policy sees what the client sends, so that agent
    # calls a tool that does not fail.
    second = "quota" if model_class is NonStreamingOpenAIModel else "lookup"
    reference_engine = _engine(family, second=second)
    reference = Agent(model=RLLMModel(reference_engine), tools=ToolLog().tools, system_prompt=SYSTEM,
                      callback_handler=None)
    expected = await run_rollout(reference, QUESTION, recorder=record(reference))

    engine = _engine(family, second=second)
    finished, session = await _serve(_own_client_agent(server, model_class), server, engine)

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == "It is \\boxed{Paris}."
    assert engine.prompts == reference_engine.prompts  # every call's prompt, token for token
    assert finished.samples == expected.samples and len(finished.samples) == 1
    assert finished.samples == [t.to_verl(None) for t in session.samples]
    (trajectory,) = finished.trajectories
    assert [len(step.tool_calls) for step in trajectory.steps] == [1, 2, 0]
    assert trajectory.steps[1].observation and trajectory.steps[1].info["stream"] is (model_class is OpenAIModel)


async def test_bad_requests_are_answered_4xx_naming_the_problem_and_the_server_keeps_serving(
        server: PolicyServer) -> None:
    url = server.base_url + "/chat/completions"
    good = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    auth = {"Authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient() as http:
        cases = [
            (await http.post(url, json=good, headers={"Authorization": "Bearer wrong"}), 401, "API key"),
            (await http.post(url, json={**good, "model": "gpt-4"}, headers=auth), 404, "'gpt-4' is not served here"),
            (await http.post(url, json=good, headers=auth), 400, "no rollout session ''"),
            (await http.post(url, content=b"{not json", headers=auth), 400, "not JSON"),
            (await http.post(url, json={"model": "policy"}, headers=auth), 400, "messages: Field required"),
            (await http.post(url, json={**good, "n": 2}, headers=auth), 400, "n: Input should be 1"),
        ]
        for response, status, message in cases:
            assert (response.status_code, message in response.json()["error"]["message"]) == (status, True), \
                response.text
        with server.open("rollout-1", _engine("qwen3")):
            answered = await http.post(url, json=good, headers={**auth, SESSION_HEADER: "rollout-1"})
    assert answered.status_code == 200
    body = answered.json()  # vLLM's fields with return_token_ids and logprobs
    choice = body["choices"][0]
    assert body["prompt_token_ids"] and len(choice["token_ids"]) == len(choice["logprobs"]["content"])
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"key": "France"}'}


class _FailingEngine(MessageScriptedEngine):
    async def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineUnavailableError("the rollout server is gone", url="http://rollout", cause="ConnectError")


@pytest.mark.parametrize("model_class", [OpenAIModel, NonStreamingOpenAIModel])
async def test_a_failing_engine_ends_the_rollout_on_infrastructure_with_the_engines_own_error(
        server: PolicyServer, model_class: type) -> None:
    family = FAMILIES["qwen3"]
    engine = _FailingEngine(family.tokenizer(), _script, tool_parser=family.tool_parser)
    finished, _ = await _serve(_own_client_agent(server, model_class), server, engine)

    assert finished.end.reason is TerminationReason.ENGINE_ERROR  # masked, never scored
    assert isinstance(finished.error, EngineUnavailableError)  # what the engine raised, not the HTTP 503 it became
    assert "the rollout server is gone" in finished.end.failure


class _BrokenEngine(MessageScriptedEngine):
    async def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in the engine")


async def test_a_bug_behind_the_server_is_an_error_with_its_cause_never_infrastructure(server: PolicyServer) -> None:
    family = FAMILIES["qwen3"]
    engine = _BrokenEngine(family.tokenizer(), _script, tool_parser=family.tool_parser)
    finished, _ = await _serve(_own_client_agent(server, OpenAIModel), server, engine)

    assert finished.end.reason is TerminationReason.ERROR  # the client saw a 400, not a 5xx it would retry as infra
    with pytest.raises(ValueError, match="a bug in the engine"):
        finished.raise_if_unexpected()  # what training does with it: the run stops with the cause


async def test_a_prompt_that_fills_the_context_is_strands_context_overflow(server: PolicyServer) -> None:
    agent = _own_client_agent(server, OpenAIModel, conversation_manager=NullConversationManager())
    finished, session = await _serve(agent, server, _engine("qwen3", context_length=40))

    assert finished.end.reason is TerminationReason.CONTEXT_OVERFLOW
    assert session.samples[0].num_turns == 0 and finished.samples == []


async def test_a_record_that_is_not_what_the_engine_sampled_stops_the_rollout(server: PolicyServer,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # A trace store that loses a token: the record read from it is not what was sampled.
    read = server.get_session

    def lossy(session_id: str) -> list[dict[str, Any]]:
        traces = read(session_id)
        traces[-1]["response"]["completion_token_ids"] = traces[-1]["response"]["completion_token_ids"][:-1]
        traces[-1]["response"]["logprobs"] = traces[-1]["response"]["logprobs"][:-1]
        return traces

    monkeypatch.setattr(server, "get_session", lossy)
    with pytest.raises(TokenTraceError, match="are not the 1 sample"):
        await _serve(_own_client_agent(server, OpenAIModel), server, _engine("qwen3"))


def test_the_endpoint_is_read_from_the_environment_or_its_absence_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=f"{BASE_URL_ENV} is not set: the trainer sets it"):
        policy_endpoint()
    monkeypatch.setenv(BASE_URL_ENV, "http://127.0.0.1:9/v1")
    monkeypatch.setenv(API_KEY_ENV, "k")
    monkeypatch.setenv(MODEL_ENV, "qwen")
    endpoint = policy_endpoint()
    assert (endpoint.base_url, endpoint.api_key, endpoint.model) == ("http://127.0.0.1:9/v1", "k", "qwen")
    assert str(endpoint.async_client().base_url).rstrip("/") == "http://127.0.0.1:9/v1"
