"""``rllm.transport`` against a real server on 127.0.0.1: retries, timeouts, the pool, one failure description."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from rllm.engine.rollout.http import engine_error
from rllm.engine.rollout.openai_engine import OpenAIEngine
from rllm.errors import (
    ContextLengthExceededError,
    EngineRequestError,
    EngineThrottledError,
    EngineUnavailableError,
    RLLMError,
)
from rllm.offline.scripted_server import ScriptedReply
from rllm.offline.uvicorn_thread import UvicornThread
from rllm.transport import HTTPFailure, HTTPTransport, describe_error

pytestmark = pytest.mark.timeout(60)


@dataclass
class Reply:
    """One scripted answer: a status, a JSON (dict) or text (str) body, headers, and a delay before it."""

    status: int = 200
    body: dict[str, Any] | str = field(default_factory=lambda: {"ok": True})
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Script:
    """What the server answers, in order (the last reply repeats), and what it was sent."""

    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, int] = field(default_factory=dict)  # "now" and "most" requests in flight

    def reset(self, *replies: Reply) -> Script:
        """Script the next replies; a request still sleeping from an earlier test counts in its own load."""
        self.replies, self.requests, self.load = list(replies), [], {"now": 0, "most": 0}
        return self


def _app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.api_route("/echo", methods=["GET", "POST"])
    async def echo(request: Request) -> Response:
        body = await request.body()
        script.requests.append({"method": request.method, "headers": dict(request.headers), "body": body,
                                "at": time.monotonic()})
        reply = script.replies[min(len(script.requests), len(script.replies)) - 1]
        load = script.load
        load["now"] += 1
        load["most"] = max(load["most"], load["now"])
        try:
            await asyncio.sleep(reply.delay)
        finally:
            load["now"] -= 1
        if isinstance(reply.body, str):
            return PlainTextResponse(reply.body, reply.status, headers=reply.headers)
        return JSONResponse(reply.body, reply.status, headers=reply.headers)

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    http = UvicornThread(_app(script), name="transport-test", lifespan="off", timeout_graceful_shutdown=1)
    port = http.start()
    yield f"http://127.0.0.1:{port}", script
    http.stop()


class Failed(RLLMError):
    """What the test transport raises: the failure it was given."""

    def __init__(self, failure: HTTPFailure) -> None:
        super().__init__(failure.cause)
        self.failure = failure


def _transport(base_url: str, **kwargs: Any) -> HTTPTransport:
    kwargs = {"max_retries": 2, "backoff_initial": 0.01, "backoff_max": 0.05, "timeout": 5.0, **kwargs}
    return HTTPTransport(base_url, Failed, **kwargs)


def _dead_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _failure(transport: HTTPTransport, method: str = "POST", path: str = "/echo") -> tuple[HTTPFailure, Failed]:
    with pytest.raises(Failed) as caught:
        await transport.request_json(method, path, json={"q": 1})
    return caught.value.failure, caught.value


async def test_retryable_statuses_are_retried_until_an_answer(server) -> None:
    url, script = server
    script.reset(Reply(503, {"detail": "busy"}), Reply(429, {"detail": "slow down"}), Reply(200, {"answer": 42}))

    assert await _transport(url).request_json("POST", "/echo", json={"q": 1}) == {"answer": 42}
    assert len(script.requests) == 3 and script.requests[0]["body"] == b'{"q":1}'


async def test_a_server_that_keeps_failing_is_described_once_with_its_own_words(server) -> None:
    url, script = server
    script.reset(Reply(502, {"error": {"message": "upstream gone", "code": 502}}))

    failure, error = await _failure(_transport(url))

    assert len(script.requests) == 3
    assert failure == HTTPFailure(f"{url}/echo", "HTTP 502: upstream gone", 3, 502, "upstream gone",
                                  '{"error":{"message":"upstream gone","code":502}}')
    assert failure.infrastructure and not failure.throttled
    assert error.__cause__ is not None  # chained to what failed, for exception_chain


@pytest.mark.parametrize(("body", "detail"), [
    ({"detail": "top_k: must be between 1 and 100"}, "top_k: must be between 1 and 100"),  # FastAPI
    ({"error": {"message": "bad tool schema", "type": "invalid_request_error"}}, "bad tool schema"),  # OpenAI
    ({"object": "error", "message": "max_model_len is 4096", "code": 400}, "max_model_len is 4096"),  # vLLM
    ({"error": "no such model"}, "no such model"),
    ("plain words\n", "plain words"),
])
async def test_a_rejected_request_fails_at_once_naming_the_servers_words(server, body, detail) -> None:
    url, script = server
    script.reset(Reply(400, body), Reply(200))

    failure, _ = await _failure(_transport(url))

    assert len(script.requests) == 1  # a 4xx is the request's fault: never retried
    assert (failure.status, failure.detail, failure.cause, failure.attempts) == (400, detail, f"HTTP 400: {detail}", 1)
    assert not failure.infrastructure


async def test_which_statuses_are_retried_is_the_callers_choice(server) -> None:
    url, script = server
    script.reset(Reply(500, {"detail": "bug"}), Reply(200))

    failure, _ = await _failure(_transport(url, retry_status=frozenset({502, 503, 504}).__contains__))

    assert len(script.requests) == 1 and failure.status == 500 and failure.infrastructure


async def test_throttling_and_refused_credentials_are_told_apart(server) -> None:
    url, script = server
    script.reset(Reply(429, {"detail": "rate limited"}))
    throttled, _ = await _failure(_transport(url, max_retries=0))
    script.reset(Reply(401, {"detail": "wrong bearer token"}))
    refused, _ = await _failure(_transport(url))

    assert throttled.throttled and throttled.infrastructure and not throttled.refused_credentials
    assert refused.refused_credentials and not refused.infrastructure and len(script.requests) == 1


async def test_a_timeout_is_retried_then_described(server) -> None:
    url, script = server
    script.reset(Reply(delay=2.0), Reply(200, {"late": False}))
    assert await _transport(url, timeout=0.3).request_json("GET", "/echo") == {"late": False}

    script.reset(Reply(delay=2.0))
    start = time.monotonic()
    failure, _ = await _failure(_transport(url, timeout=0.3, max_retries=1))

    assert time.monotonic() - start < 1.8  # two bounded attempts, not one 2 s wait
    assert (failure.status, failure.cause, failure.attempts) == (None, "request timed out", 2)
    assert failure.infrastructure and len(script.requests) == 2


async def test_an_unreachable_server_is_described_as_such() -> None:
    failure, _ = await _failure(_transport(_dead_url(), max_retries=1))

    assert failure.status is None and failure.attempts == 2 and failure.infrastructure
    assert failure.cause.startswith("connection failed: connection refused or host unreachable")


async def test_an_answer_that_is_not_json_is_garbled_not_the_requests_fault(server) -> None:
    url, script = server
    script.reset(Reply(200, "<html>proxy login</html>"))

    failure, _ = await _failure(_transport(url))

    assert failure.garbled and failure.infrastructure and failure.status == 200 and len(script.requests) == 1
    assert failure.body == "<html>proxy login</html>"
    # a caller that does not need JSON gets the answer itself
    assert (await _transport(url).request("GET", "/echo")).text == "<html>proxy login</html>"


async def test_retry_after_is_honoured_but_capped_by_backoff_max(server) -> None:
    url, script = server
    script.reset(Reply(503, {"detail": "queue full"}, {"Retry-After": "0.4"}), Reply(200))
    await _transport(url, backoff_max=2.0).request_json("GET", "/echo")
    waited = script.requests[1]["at"] - script.requests[0]["at"]

    script.reset(Reply(503, {"detail": "queue full"}, {"Retry-After": "30"}), Reply(200))
    start = time.monotonic()
    await _transport(url, backoff_max=0.1).request_json("GET", "/echo")

    assert waited >= 0.4
    assert time.monotonic() - start < 5


async def test_headers_travel_with_every_request_and_per_call_ones_are_added(server) -> None:
    url, script = server
    script.reset(Reply(200))

    await _transport(url, headers={"Authorization": "Bearer tok"}).request_json(
        "POST", "/echo", json={}, headers={"X-Session-ID": "s1"})

    sent = script.requests[0]["headers"]
    assert (sent["authorization"], sent["x-session-id"]) == ("Bearer tok", "s1")


async def test_the_pool_bounds_connections_per_event_loop(server) -> None:
    url, script = server
    script.reset(Reply(200, delay=0.2))
    transport = _transport(url, max_connections=2)

    await asyncio.gather(*(transport.request_json("GET", "/echo") for _ in range(6)))
    await transport.aclose()

    assert len(script.requests) == 6 and script.load["most"] == 2


async def test_one_pool_per_event_loop(server) -> None:
    """Strands' synchronous ``Agent.__call__`` runs each call on a fresh loop; the transport must survive that."""
    url, script = server
    script.reset(Reply(200, {"ok": 1}))
    transport = _transport(url)

    def in_new_loop() -> Any:
        return asyncio.run(transport.request_json("GET", "/echo"))

    assert await asyncio.to_thread(in_new_loop) == {"ok": 1}
    assert await asyncio.to_thread(in_new_loop) == {"ok": 1}
    assert await transport.request_json("GET", "/echo") == {"ok": 1}


async def test_openai_engine_sends_vllms_sampling_extensions_beside_the_standard_fields(serve) -> None:
    """On plain HTTP the allow-listed extensions reach the server (the openai SDK refused ``top_k`` with a TypeError)."""
    server = serve(lambda body: ScriptedReply(content="ok"))
    engine = OpenAIEngine("scripted", server.base_url, return_token_ids=True, top_k=20, min_p=0.05)

    output = await engine.get_model_response([{"role": "user", "content": "hi"}], repetition_penalty=1.1,
                                             chat_template_kwargs={"enable_thinking": False})
    await engine.close()

    sent = server.requests[0]
    assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (20, 0.05, 1.1)
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["return_token_ids"] is True and "extra_body" not in sent
    assert output.text == "ok" and output.completion_ids and output.prompt_ids  # vLLM's extra fields are read


@pytest.mark.parametrize(("failure", "expected"), [
    (HTTPFailure("u", "HTTP 429: slow", 6, 429), EngineThrottledError),
    (HTTPFailure("u", "request timed out", 6), EngineUnavailableError),
    (HTTPFailure("u", "HTTP 503: down", 6, 503), EngineUnavailableError),
    (HTTPFailure("u", "HTTP 200: the answer is not JSON", 1, 200, garbled=True), EngineUnavailableError),
    (HTTPFailure("u", "HTTP 400: too long", 1, 400, "too long", '{"code": "context_length_exceeded"}'),
     ContextLengthExceededError),
    (HTTPFailure("u", "HTTP 400: bad schema", 1, 400, "bad schema", "bad schema"), EngineRequestError),
])
def test_engines_turn_a_failure_into_their_typed_error(failure: HTTPFailure, expected: type) -> None:
    error = engine_error(failure)

    assert type(error) is expected
    assert (error.url, error.cause) == ("u", failure.cause) and failure.cause in str(error)


def test_describe_error_names_what_kind_of_failure_it_was() -> None:
    assert describe_error(httpx.ReadTimeout("x")) == "request timed out"
    assert describe_error(httpx.ConnectError("")) == "connection failed: connection refused or host unreachable"
    closed = describe_error(httpx.RemoteProtocolError("peer closed"))
    assert closed == "connection failed (RemoteProtocolError: peer closed)"
