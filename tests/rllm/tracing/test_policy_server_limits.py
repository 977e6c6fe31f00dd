"""The policy server holds like the retrieval server: 4xx for what is malformed, bounded bodies, calls and time.

Every request goes through the real ``openai`` client (its retries on where the test says so),
over HTTP to a ``PolicyServer`` on 127.0.0.1; the engine is ``MessageScriptedEngine`` on Qwen3's
real tokenizer, slowed or blocked from outside (a subclass) where a test needs a call in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fixtures.strands_agents import SYSTEM
from strands import Agent
from strands.models.openai import OpenAIModel

from rllm.errors import ServerStartError
from rllm.integrations.strands import record, run_served_rollout
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.tracing import PolicyServer
from rllm.tracing.session import session
from rllm.types import TerminationReason

QUESTION = "What is the capital of France?"
HI = [{"role": "user", "content": "hi"}]


def _answer(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": "It is \\boxed{Paris}."}


class _Engine(MessageScriptedEngine):
    """Answers at once, or waits ``delays[i]`` seconds first at its i-th call; records the sampling it was given."""

    def __init__(self, delays: list[float] | None = None, **sampling: Any) -> None:
        family = FAMILIES["qwen3"]
        super().__init__(family.tokenizer(), _answer, tool_parser=family.tool_parser,
                         chat_template_kwargs=family.chat_template_kwargs, **sampling)
        self.delays = list(delays or [])
        self.sampling: list[dict[str, Any]] = []

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: Any) -> Any:
        index = len(self.sampling)
        self.sampling.append(dict(sampling))
        if index < len(self.delays):
            await asyncio.sleep(self.delays[index])
        return await super()._generate(prompt_ids, max_new_tokens, sampling, session)


@pytest.fixture
async def server() -> AsyncIterator[PolicyServer]:
    policy = await PolicyServer(max_body_bytes=1024 * 1024).start()
    yield policy
    await policy.stop()


def _counting_client(server: PolicyServer, sent: list[str], **kwargs: Any) -> openai.AsyncOpenAI:
    """The traced client of ``server``, noting every HTTP request it sends (its own retries included)."""

    async def note(request: httpx.Request) -> None:
        sent.append(request.url.path)

    return server.endpoint().async_client(http_client=httpx.AsyncClient(event_hooks={"request": [note]}), **kwargs)


async def _still_serves(server: PolicyServer) -> None:
    with server.open("rollout-after", _Engine()):
        async with session(session_id="rollout-after"):
            answer = await server.endpoint().async_client().chat.completions.create(model="policy", messages=HI)
    assert answer.choices[0].message.content == "It is \\boxed{Paris}."


@pytest.mark.parametrize(("field", "value"), [
    ("n", [1]), ("n", 2), ("max_tokens", "many"), ("max_tokens", 0), ("stream_options", "yes"),
    ("temperature", "hot"), ("messages", "hi"), ("messages", [{"content": "no role"}]), ("tools", {"name": "x"}),
    ("logprobs", "yes"), ("response_format", {"type": "json_object"}),
])
async def test_a_malformed_field_is_a_400_naming_it_never_retried(server: PolicyServer, field: str,
                                                                   value: Any) -> None:
    sent: list[str] = []
    client = _counting_client(server, sent)  # the client's default retries: a 4xx is not retried
    body = {"model": "policy", "messages": HI, field: value}
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="policy", messages=HI, extra_body=body)
    assert field in str(raised.value.message)
    assert len(sent) == 1
    await _still_serves(server)


async def test_a_body_over_the_limit_is_a_413_before_it_is_read(server: PolicyServer) -> None:
    sent: list[str] = []
    client = _counting_client(server, sent, max_retries=0)
    started = time.perf_counter()
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 50_000_000}])
    elapsed = time.perf_counter() - started
    assert raised.value.status_code == 413 and "limit is 1048576 bytes" in raised.value.message
    assert elapsed < 5.0, elapsed
    await _still_serves(server)


async def test_a_chunked_body_over_the_limit_is_a_413(server: PolicyServer) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "policy", "messages": [{"role": "user", "content": "'
        for _ in range(200):
            yield b"x" * 65536
        yield b'"}]}'

    async with httpx.AsyncClient() as http:
        response = await http.post(server.base_url + "/chat/completions", content=chunks(),
                                   headers={"Authorization": f"Bearer {server.api_key}"})
    assert response.status_code == 413
    await _still_serves(server)


async def test_calls_past_the_concurrency_bound_are_503_with_retry_after() -> None:
    server = await PolicyServer(max_in_flight=1).start()
    try:
        slow = _Engine(delays=[1.0])
        with server.open("rollout-a", slow), server.open("rollout-b", _Engine()):
            client = server.endpoint().async_client(max_retries=0)

            async def call(session_id: str) -> Any:
                async with session(session_id=session_id):
                    return await client.chat.completions.create(model="policy", messages=HI)

            first = asyncio.create_task(call("rollout-a"))
            while not slow.sampling:
                await asyncio.sleep(0.01)
            with pytest.raises(openai.InternalServerError) as raised:
                await call("rollout-b")
            assert raised.value.status_code == 503 and raised.value.response.headers["retry-after"] == "1"
            assert "max_in_flight" in raised.value.message
            assert (await first).choices[0].message.content == "It is \\boxed{Paris}."
            assert (await call("rollout-b")).choices[0].message.content == "It is \\boxed{Paris}."
    finally:
        await server.stop()


async def test_a_call_past_the_request_timeout_is_cancelled_and_its_retry_continues_the_sample() -> None:
    server = await PolicyServer(request_timeout_s=0.5).start()
    try:
        engine = _Engine(delays=[10.0])  # the first call hangs; the client's retry of its 504 answers
        model = OpenAIModel(client=server.endpoint().async_client(max_retries=1), model_id=server.model)
        agent = Agent(model=model, system_prompt=SYSTEM, callback_handler=None)
        started = time.perf_counter()
        finished = await run_served_rollout(agent, QUESTION, server, engine, recorder=record(agent))
    finally:
        await server.stop()
    assert time.perf_counter() - started < 5.0
    assert finished.end.reason is TerminationReason.FINISHED and len(engine.sampling) == 2
    (token_session,) = finished.token_sessions
    assert len(finished.samples) == 1 and finished.samples == [t.to_verl(None) for t in token_session.samples]


async def test_a_persistent_timeout_ends_the_rollout_on_infrastructure() -> None:
    server = await PolicyServer(request_timeout_s=0.2).start()
    try:
        model = OpenAIModel(client=server.endpoint().async_client(max_retries=0), model_id=server.model)
        agent = Agent(model=model, system_prompt=SYSTEM, callback_handler=None)
        finished = await run_served_rollout(agent, QUESTION, server, _Engine(delays=[10.0]), recorder=record(agent))
    finally:
        await server.stop()
    assert finished.end.reason is TerminationReason.ENGINE_ERROR and "request_timeout_s" in finished.end.failure


async def test_a_failed_start_raises_at_once_in_every_task_awaiting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_startup(self: uvicorn.Server, sockets: Any = None) -> None:
        raise OSError("no sockets left")

    monkeypatch.setattr(uvicorn.Server, "startup", broken_startup)
    server = PolicyServer()
    results = await asyncio.wait_for(asyncio.gather(server.start(), server.start(), return_exceptions=True), 5.0)
    assert [type(r) for r in results] == [ServerStartError, ServerStartError]
    assert all("no sockets left" in str(r) for r in results)


async def test_the_trainer_owns_sampling_and_says_so_once(server: PolicyServer, caplog: pytest.LogCaptureFixture,
                                                         ) -> None:
    params = {"temperature": 0.3, "top_p": 0.5, "frequency_penalty": 1.5, "max_tokens": 64}
    engines = []
    with caplog.at_level(logging.WARNING, logger="rllm.tracing.policy_server"):
        for _ in range(2):  # two rollouts on one server: one warning
            engine = _Engine(temperature=1.0, top_p=1.0)  # the trainer's sampling
            engines.append(engine)
            model = OpenAIModel(client=server.endpoint().async_client(), model_id=server.model, params=params)
            agent = Agent(model=model, system_prompt=SYSTEM, callback_handler=None)
            finished = await run_served_rollout(agent, QUESTION, server, engine, recorder=record(agent))
            assert finished.end.reason is TerminationReason.FINISHED
    received = [s for e in engines for s in e.sampling]
    assert received and all(s == {"temperature": 1.0, "top_p": 1.0} for s in received), received
    warnings = [r.getMessage() for r in caplog.records if "ignores the sampling" in r.getMessage()]
    assert len(warnings) == 1 and "frequency_penalty, temperature, top_p" in warnings[0]
