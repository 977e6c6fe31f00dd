"""RetrievalClient and the ``local_search`` Strands tool against the real retrieval server (and without one)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag.client import RetrievalClient, check_health, check_search, format_passages, make_local_search_tool
from rag.errors import RetrievalAuthError, RetrievalError, RetrievalUnavailableError
from rag.retriever import Retriever
from rag.server import ServerSettings
from rag.testing import RetrievalServer, SlowRetriever, demo_index
from rllm.engine.rollout import OpenAIEngine
from rllm.errors import ConfigurationError, ToolBackendError
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> Retriever:
    return Retriever.load(demo_index(tmp_path_factory.getbasetemp(), 200))


@pytest.fixture(scope="module")
def server(retriever: Retriever) -> Iterator[RetrievalServer]:
    with RetrievalServer(retriever) as srv:
        yield srv


def _dead_url() -> str:
    """A 127.0.0.1 URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _call(tool: Any, **tool_input: Any) -> dict[str, Any]:
    """Run a Strands tool the way an agent does and return its ToolResult."""
    event = None
    async for event in tool.stream({"toolUseId": "t1", "name": tool.tool_name, "input": tool_input}, {}):
        pass
    return event["tool_result"]


async def test_client_search_health_and_batch(server: RetrievalServer, retriever: Retriever) -> None:
    client = RetrievalClient(server.base_url)
    text = retriever.corpus[42]["contents"]
    hits = await client.search(text, top_k=2)
    assert [set(h) for h in hits] == [{"id", "title", "contents", "content", "score"}] * 2
    assert hits[0]["id"] == "42"
    batch = await client.search_batch([text, retriever.corpus[7]["contents"]], top_k=1)
    assert [b[0]["id"] for b in batch] == ["42", "7"]
    health = await client.health()
    assert health["corpus_size"] == 200
    await client.aclose()


async def test_client_names_a_rejected_request(server: RetrievalServer) -> None:
    client = RetrievalClient(server.base_url)
    with pytest.raises(RetrievalError, match=r"HTTP 422.*top_k: must be between 1 and 100 \(got 0\)") as info:
        await client.search("film", top_k=0)
    assert info.value.status == 422
    await client.aclose()


def test_format_passages_numbers_and_titles() -> None:
    text = format_passages([{"title": "Krull (film)", "contents": "Krull is a 1983 film.", "score": 0.9},
                            {"title": "", "contents": "No title here, and a long tail", "score": 0.5}], max_chars=12)
    assert text == "[1] Krull (film)\nKrull is a 1...\n\n[2] No title her..."
    assert format_passages([]) == "No passages found."


async def test_local_search_tool_returns_numbered_passages(server: RetrievalServer) -> None:
    local_search = make_local_search_tool(server.base_url)
    assert local_search.tool_name == "local_search"
    schema = local_search.tool_spec["inputSchema"]["json"]
    assert set(schema["properties"]) == {"query", "top_k"} and schema["required"] == ["query"]
    result = await _call(local_search, query="Who directed the 1983 fantasy film Krull?", top_k=2)
    assert result["status"] == "success"
    text = result["content"][0]["text"]
    assert text.startswith("[1] ") and "\n\n[2] " in text and "[3]" not in text
    assert "Krull (film)" in text


async def _call_with_exception(tool: Any, **tool_input: Any) -> tuple[dict[str, Any], BaseException | None]:
    """The ToolResult and the exception Strands attaches to it (what ``AfterToolCallEvent.exception`` gets)."""
    event = None
    async for event in tool.stream({"toolUseId": "t1", "name": tool.tool_name, "input": tool_input}, {}):
        pass
    return event["tool_result"], event.exception


async def test_local_search_raises_a_typed_backend_failure_the_model_still_reads() -> None:
    local_search = make_local_search_tool(_dead_url(), max_retries=1, backoff_initial=0.01)
    start = time.monotonic()
    result, error = await _call_with_exception(local_search, query="anything")
    assert time.monotonic() - start < 10
    # The typed signal: the exception object, an infrastructure error, not a text pattern.
    assert isinstance(error, RetrievalUnavailableError) and isinstance(error, ToolBackendError)
    # The model still reads what went wrong.
    assert result["status"] == "error"
    text = result["content"][0]["text"]
    assert text.startswith("Error: RetrievalUnavailableError - retrieval server at http://127.0.0.1:")
    assert "unreachable after 2 attempts" in text and "connection refused" in text
    with pytest.raises(RetrievalUnavailableError, match="unreachable"):
        await check_health(_dead_url())


async def test_local_search_reports_bad_arguments_as_text(server: RetrievalServer) -> None:
    result, error = await _call_with_exception(make_local_search_tool(server.base_url), query="   ", top_k=3)
    assert result["status"] == "error" and error is None  # the policy's query: text only, no typed failure
    assert "query: must not be empty or whitespace" in result["content"][0]["text"]


async def test_client_retries_503_until_the_queue_drains(retriever: Retriever) -> None:
    settings = ServerSettings(max_batch_size=1, max_queue=1, retry_after=1)
    with RetrievalServer(SlowRetriever(retriever, 0.2), settings) as srv:
        client = RetrievalClient(srv.base_url, max_retries=8, backoff_initial=0.05, backoff_max=1.0)
        answers = await asyncio.gather(*(client.search(f"question number {i}", 1) for i in range(4)))
        assert all(len(a) == 1 for a in answers)
        metrics = await client._request("GET", "/metrics")
        await client.aclose()
    assert metrics["rejected_overload"] > 0  # some attempts were turned away and retried


async def test_token_is_sent_when_given_and_a_refused_token_is_a_configuration_error(retriever: Retriever) -> None:
    with RetrievalServer(retriever, ServerSettings(token="tok")) as srv:
        assert (await RetrievalClient(srv.base_url, token="tok").search("film", 1))
        assert (await check_search(srv.base_url, "tok"))
        result, error = await _call_with_exception(make_local_search_tool(srv.base_url), query="film")
        with pytest.raises(RetrievalAuthError, match=r"HTTP 401.*wrong bearer token.*set RETRIEVAL_TOKEN"):
            await check_search(srv.base_url, "not-the-token")
    assert isinstance(error, RetrievalAuthError) and isinstance(error, ConfigurationError)
    assert error.status == 401 and not isinstance(error, ToolBackendError)
    text = result["content"][0]["text"]
    assert result["status"] == "error" and "missing bearer token" in text
    assert "the client sent no token: set RETRIEVAL_TOKEN to the token the server was started with" in text


def test_tool_works_from_fresh_event_loops(server: RetrievalServer) -> None:
    """Strands' synchronous Agent call runs each invocation on a new loop; the tool keeps one pool per loop."""
    local_search = make_local_search_tool(server.base_url)
    for _ in range(3):
        assert asyncio.run(_call(local_search, query="film"))["status"] == "success"


def _search_then_answer(body: dict[str, Any]) -> ScriptedReply:
    tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool_messages:
        return ScriptedReply(tool_calls=[ScriptedToolCall(
            "local_search", json.dumps({"query": "Krull 1983 fantasy film director", "top_k": 2}))])
    return ScriptedReply(content="Peter Yates directed it. \\boxed{Peter Yates}")


async def test_strands_agent_uses_local_search(server: RetrievalServer, serve) -> None:
    model_server = serve(_search_then_answer)
    agent = StrandsAgent(RLLMModel(OpenAIEngine(model="scripted", base_url=model_server.base_url)),
                         tools=[make_local_search_tool(server.base_url)], system_prompt="Search, then answer.")
    await agent.invoke_async("Who directed Krull?")
    steps = agent.trajectory.steps
    assert [c.name for c in steps[0].tool_calls] == ["local_search"]
    observation = steps[0].observation[0]["content"]
    observation = observation if isinstance(observation, str) else json.dumps(observation)
    assert "[1] " in observation and "Krull (film)" in observation
    assert steps[-1].model_output.text.endswith("\\boxed{Peter Yates}")


def test_example_retrieve_tool_runs_against_the_server_url(server: RetrievalServer) -> None:
    """rag/README.md's example script, run as a user runs it: checks the server named by the env, then searches."""
    env = {**os.environ, "RETRIEVAL_SERVER_URL": server.base_url}
    done = subprocess.run([sys.executable, str(REPO / "examples/strands/retrieve_tool.py"), "Krull"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{server.base_url}: 200 passages") and "\n[1] " in done.stdout