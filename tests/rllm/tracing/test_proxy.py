"""Trace capture end to end: a real LiteLLM proxy subprocess on 127.0.0.1 in front of scripted vLLM-style servers.

The proxy runs from its own virtual environment, created here when missing (``$RLLM_PROXY_VENV`` or
``.cache/litellm-venv``; a few minutes the first time, reused afterwards).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from stat import S_IMODE
from typing import Any

import httpx
import openai
import pytest
from fixtures.keyed_server import KeyedOpenAIServer
from strands import Agent, tool
from strands.models.openai import OpenAIModel

from rllm.integrations.strands import NonStreamingOpenAIModel
from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall, ToyChatTokens
from rllm.tracing import (
    NO_SESSION,
    SESSION_HEADER,
    Backend,
    ContextThreadPoolExecutor,
    ProxyConfig,
    ProxyProcess,
    TraceStore,
    bind,
    get_chat_client,
    get_chat_client_async,
    install_proxy_venv,
    load_trajectory,
    session,
)
from rllm.tracing.proxy import backend_key_env, write_config

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the web",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                           "required": ["q"]}}}]


def _agent_script(body: dict[str, Any]) -> ScriptedReply:
    """Two searches, then an answer, when tools are offered; otherwise ``turn N`` (N = assistant turns so far)."""
    turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
    if body["messages"][-1].get("content") == "please fail":
        return ScriptedReply(status=400, error="prompt is too long: 9000 tokens > 8192")
    if body.get("tools") and turn < 2:
        return ScriptedReply(content="", tool_calls=[ScriptedToolCall("search", json.dumps({"q": f"query {turn}"}))])
    return ScriptedReply(content=f"\\boxed{{answer {turn}}}" if body.get("tools") else f"turn {turn}")


@pytest.fixture(scope="session")
def proxy_venv() -> Path:
    os.environ.setdefault("RLLM_PROXY_VENV", str(REPO / ".cache" / "litellm-venv"))
    return install_proxy_venv()


@pytest.fixture(scope="module")
def backends() -> Iterator[list[ScriptedOpenAIServer]]:
    servers = [ScriptedOpenAIServer(ToyChatTokens.wrap(_agent_script), model="served-model").start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def proxy(proxy_venv: Path, backends: list[ScriptedOpenAIServer], tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[ProxyProcess]:
    run_dir = tmp_path_factory.mktemp("proxy")
    config = ProxyConfig(backends=[*(Backend(s.base_url, "served-model") for s in backends),
                                   Backend(backends[0].base_url, "served-model", kind="openai", model_name="plain")],
                         db_path=run_dir / "traces.db")
    process = ProxyProcess(config, run_dir=run_dir, venv=proxy_venv)
    # The port it picked is taken before it binds, as another process on a busy machine may take it: it must
    # notice (the bind error sits above uvicorn's long traceback in its log) and start on another.
    picked = process.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", picked))
        squatter.listen()
        with process as running:
            assert running.port != picked and "address already in use" in running.log_path.read_text().lower()
            yield running


@pytest.fixture
def store(proxy: ProxyProcess) -> Iterator[TraceStore]:
    with TraceStore(proxy.config.db_path) as reader:
        yield reader


def _aclient(proxy: ProxyProcess, **kwargs: Any) -> openai.AsyncOpenAI:
    return get_chat_client_async(proxy.base_url, proxy.api_key, max_retries=0, **kwargs)


async def test_concurrent_sessions_come_back_complete_and_in_call_order(
        proxy: ProxyProcess, store: TraceStore, backends: list[ScriptedOpenAIServer]) -> None:
    client = _aclient(proxy)

    async def rollout(i: int) -> str:
        async with session(f"rollout-{i}") as s:
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"I am rollout {i}"}]
            for _ in range(5):
                await asyncio.sleep(random.random() * 0.02)
                reply = await client.chat.completions.create(model="policy", messages=messages,
                                                             stream=random.random() < 0.5)
                if isinstance(reply, openai.AsyncStream):
                    text = "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
                else:
                    text = reply.choices[0].message.content
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
        return s.id

    ids = await asyncio.gather(*(rollout(i) for i in range(32)))
    await client.close()
    assert sum(len(store.get_session(sid)) for sid in ids) == 160
    used_backends = set()
    for i, sid in enumerate(ids):
        traces = store.get_session(sid)
        assert [t["seq"] for t in traces] == list(range(5))
        assert [t["response"]["message"]["content"] for t in traces] == [f"turn {k}" for k in range(5)]
        assert all(t["request"]["messages"][0]["content"] == f"I am rollout {i}" for t in traces)
        assert all(t["error"] is None and not t["no_session"] for t in traces)
        # Sticky routing: every call of a session went to the same backend (its prefix cache).
        assert len({t["backend"] for t in traces}) == 1
        used_backends.add(traces[0]["backend"])
    assert used_backends == {s.base_url for s in backends}


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
async def test_tool_calls_are_captured_with_token_ids_streamed_or_not(
        proxy: ProxyProcess, store: TraceStore, stream: bool) -> None:
    client = _aclient(proxy)
    messages = [{"role": "user", "content": "who wrote it?"}]
    async with session("tools") as s:
        kwargs: dict[str, Any] = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.6,
                                  "max_tokens": 64}
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True})]
            calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert [(tc.function.name, tc.function.arguments) for tc in calls] == [("search", '{"q": "query 0"}')]
            assert finish == ["tool_calls"]
            assert [c.usage.completion_tokens for c in chunks if c.usage] == [
                len(ToyChatTokens.completion_ids(_agent_script({"messages": messages, "tools": TOOLS})))]
        else:
            reply = await client.chat.completions.create(**kwargs)
            assert reply.choices[0].message.tool_calls[0].function.arguments == '{"q": "query 0"}'
    await client.close()
    (trace,) = store.get_session(s.id)
    expected = _agent_script({"messages": messages, "tools": TOOLS})
    assert trace["request"]["stream"] is stream
    assert trace["request"]["tools"] == TOOLS
    assert trace["request"]["sampling"] == {"temperature": 0.6, "max_tokens": 64}
    response = trace["response"]
    assert response["finish_reason"] == "tool_calls"
    assert [c["function"] for c in response["message"]["tool_calls"]] == [
        {"name": "search", "arguments": '{"q": "query 0"}'}]
    assert response["prompt_token_ids"] == ToyChatTokens.prompt_ids(messages)
    assert response["completion_token_ids"] == ToyChatTokens.completion_ids(expected)
    assert response["logprobs"] == [-0.1] * len(response["completion_token_ids"])
    assert trace["latency_ms"] > 0


async def test_other_openai_compatible_backends_are_captured_from_the_success_log(
        proxy: ProxyProcess, store: TraceStore) -> None:
    client = _aclient(proxy)
    messages = [{"role": "user", "content": "plain backend"}]
    async with session("plain") as s:
        await client.chat.completions.create(model="plain", messages=messages, tools=TOOLS)
        stream = await client.chat.completions.create(model="plain", messages=messages, tools=TOOLS, stream=True)
        [c async for c in stream]
    await client.close()
    traces = await asyncio.to_thread(_wait_for, store, s.id, 2)  # logged after the reply, not before it
    assert [t["request"]["stream"] for t in traces] == [False, True]
    for trace in traces:
        assert trace["response"]["message"]["tool_calls"][0]["function"]["name"] == "search"
        assert trace["response"]["finish_reason"] == "tool_calls" and not trace["no_session"]
    # Only the rllm_vllm provider asks for token ids; LiteLLM's openai/ provider does not.
    assert traces[0]["response"]["completion_token_ids"] is None


def _wait_for(store: TraceStore, session_id: str, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while len(traces := store.get_session(session_id)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return traces


async def test_a_session_opened_in_async_code_keeps_its_id_in_threads(proxy: ProxyProcess, store: TraceStore) -> None:
    sync_client = get_chat_client(proxy.base_url, proxy.api_key, max_retries=0)
    loop = asyncio.get_running_loop()

    def call(text: str) -> str:
        return sync_client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": text}]).choices[0].message.content

    async with session("threads") as s:
        await asyncio.to_thread(call, "to_thread")
        await loop.run_in_executor(None, bind(call), "run_in_executor")
        with ContextThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(call, ["pool a", "pool b"]))
        worker = threading.Thread(target=bind(call), args=("thread",))
        worker.start()
        worker.join()
    sync_client.close()
    traces = store.get_session(s.id)
    assert sorted(t["request"]["messages"][0]["content"] for t in traces) == sorted(
        ["to_thread", "run_in_executor", "pool a", "pool b", "thread"])
    assert not any(t["no_session"] for t in traces)


async def test_no_task_data_in_any_url_or_header(proxy: ProxyProcess, store: TraceStore,
                                                 backends: list[ScriptedOpenAIServer]) -> None:
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    secret = "GROUND-TRUTH-Ulaanbaatar-1921"
    client = _aclient(proxy, http_client=httpx.AsyncClient(event_hooks={"request": [record]}))
    async with session("task-42", session_id=None, answer=secret, task={"id": 42, "answer": secret},
                       store=store) as s:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "capital?"}])
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "capital?"}],
                                             stream=True)
    await client.close()
    assert len(sent) == 2
    for request in sent:
        assert secret not in str(request.url) and "task-42" not in str(request.url)
        assert request.url.path == "/v1/chat/completions" and not request.url.query
        assert request.headers[SESSION_HEADER] == s.id
        assert not any(secret in v or "task-42" in v for v in request.headers.values())
        assert secret not in request.content.decode()
    assert not any(secret in json.dumps(body) for b in backends for body in b.requests)
    # The metadata stayed local: only this process's store row has it, the traces do not.
    store.flush()
    assert store.session_info(s.id).metadata["answer"] == secret
    assert all(secret not in json.dumps(t) for t in store.get_session(s.id))


async def test_requests_without_a_session_are_stored_with_a_warning(
        proxy: ProxyProcess, store: TraceStore, caplog: pytest.LogCaptureFixture) -> None:
    before = len(store.get_session(NO_SESSION))
    client = _aclient(proxy)
    with caplog.at_level(logging.WARNING, logger="rllm.tracing.client"):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "orphan call"}])
    await client.close()
    traces = store.get_session(NO_SESSION)
    assert len(traces) == before + 1
    assert traces[-1]["no_session"] and traces[-1]["request"]["messages"][0]["content"] == "orphan call"
    assert "outside any rllm session" in caplog.text
    assert f"request without an {SESSION_HEADER} header" in proxy.log_path.read_text()


async def test_a_failed_call_reaches_the_client_as_a_4xx_and_is_stored_as_failed(
        proxy: ProxyProcess, store: TraceStore) -> None:
    client = _aclient(proxy)
    async with session("fails") as s:
        with pytest.raises(openai.BadRequestError, match="prompt is too long"):
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "please fail"}])
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "fine"}])
    await client.close()
    traces = store.get_session(s.id)
    assert [t["error"]["status"] if t["error"] else None for t in traces] == [400, None]
    assert "prompt is too long" in traces[0]["error"]["message"] and traces[0]["response"] is None
    assert load_trajectory(store, s.id).report()["failed_calls"] == 1


async def test_a_malformed_session_header_is_refused_with_a_400(proxy: ProxyProcess) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{proxy.base_url}/chat/completions",
                                   headers={"Authorization": f"Bearer {proxy.api_key}", SESSION_HEADER: "bad id!"},
                                   json={"model": "policy", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 400
    assert SESSION_HEADER in response.text


@pytest.mark.parametrize("model_cls", [OpenAIModel, NonStreamingOpenAIModel], ids=["streaming", "non-streaming"])
async def test_a_stock_strands_agent_comes_back_as_an_ordered_trajectory(
        proxy: ProxyProcess, store: TraceStore, backends: list[ScriptedOpenAIServer], model_cls: type) -> None:
    @tool
    def search(q: str) -> str:
        """Search the web.

        Args:
            q: The query.
        """
        return f"results for {q}"

    client = _aclient(proxy)
    agent = Agent(model=model_cls(client=client, model_id="policy", params={"temperature": 0.7}), tools=[search],
                  system_prompt="Answer in \\boxed{}.", callback_handler=None)
    async with session("strands", task_id=7) as s:
        result = await agent.invoke_async("Who founded it?")
    await client.close()
    assert "answer 2" in str(result)

    rebuilt = load_trajectory(store, s.id)
    steps = rebuilt.trajectory.steps
    assert [st.info["seq"] for st in steps] == [0, 1, 2]
    assert [st.info["stream"] for st in steps] == [model_cls is OpenAIModel] * 3
    assert [[c.name for c in st.tool_calls] for st in steps] == [["search"], ["search"], []]
    assert [st.tool_calls[0].input for st in steps[:2]] == [{"q": "query 0"}, {"q": "query 1"}]
    assert steps[0].observation[0]["role"] == "tool" and "results for query 0" in json.dumps(steps[0].observation)
    assert steps[-1].model_output.text == "\\boxed{answer 2}"
    # One token sequence whose sampled tokens are exactly the completions the backend served, in order.
    assert rebuilt.report() == {"steps": 3, "token_sequences": 1, "merged_calls": 2, "separate_calls": 1,
                                "calls_without_token_ids": 0, "failed_calls": 0}
    trace = rebuilt.trajectory.token_trace
    served = [ToyChatTokens.completion_ids(_agent_script({"messages": st.messages, "tools": st.tools}))
              for st in steps]
    assert [t for t, m in zip(trace.token_ids, trace.loss_mask) if m] == [i for ids in served for i in ids]
    assert trace.token_ids == ToyChatTokens.prompt_ids(steps[-1].messages) + served[-1]
    assert trace.token_ids[: trace.prompt_length] == ToyChatTokens.prompt_ids(steps[0].messages)


async def test_stopping_and_restarting_the_proxy_loses_nothing_acknowledged(
        proxy: ProxyProcess, store: TraceStore) -> None:
    acknowledged: dict[str, list[str]] = {}
    before_restart = 0
    restarted = asyncio.Event()
    client = _aclient(proxy)

    async def worker(i: int) -> None:
        nonlocal before_restart
        calls_after_restart = 0
        async with session(f"restart-{i}") as s:
            acknowledged[s.id] = []
            while calls_after_restart < 3:
                try:
                    reply = await client.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": f"worker {i}"}], stream=i % 2 == 0)
                    if isinstance(reply, openai.AsyncStream):
                        reply_id = [c.id async for c in reply][0]
                    else:
                        reply_id = reply.id
                except (openai.APIConnectionError, openai.InternalServerError):
                    await asyncio.sleep(0.2)  # the proxy is down: nothing was acknowledged, try again
                    continue
                acknowledged[s.id].append(reply_id)
                if restarted.is_set():
                    calls_after_restart += 1
                else:
                    before_restart += 1
                await asyncio.sleep(0.01)

    workers = [asyncio.create_task(worker(i)) for i in range(6)]
    await asyncio.sleep(1.0)
    await asyncio.to_thread(proxy.restart)
    restarted.set()
    assert before_restart >= 6, "every worker had calls acknowledged before the restart"
    await asyncio.wait_for(asyncio.gather(*workers), timeout=120)
    await client.close()
    for sid, reply_ids in acknowledged.items():
        traces = store.get_session(sid)
        stored = {t["response"]["id"] for t in traces if t["response"]}
        assert set(reply_ids) <= stored, f"{len(set(reply_ids) - stored)} acknowledged calls lost in {sid}"
        seqs = [t["seq"] for t in traces]
        assert seqs == sorted(set(seqs)), "sequence numbers continue after the restart, without reuse"


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc), the proxy's LiteLLM process among them."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def test_the_proxy_cli_stopped_by_the_pid_it_prints_leaves_no_process_and_frees_its_port(
        proxy_venv: Path, backends: list[ScriptedOpenAIServer], tmp_path: Path) -> None:
    import signal
    import socket
    import subprocess
    import sys

    command = [sys.executable, "-m", "rllm.tracing.proxy", "start", "--backend", backends[0].base_url,
               "--served-model", "served-model", "--db", str(tmp_path / "traces.db"), "--venv", str(proxy_venv)]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        line = cli.stdout.readline() if cli.stdout else ""
        assert line.startswith("proxy ready:"), line
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        pid = int(fields["pid"].strip("("))
        port = int(fields["base_url"].rsplit(":", 1)[1].split("/")[0])
        children = _children(pid)
        assert pid == cli.pid and children  # LiteLLM runs as a child, in its own session
        os.kill(pid, signal.SIGTERM)  # `kill PID`; Ctrl-C (SIGINT) takes the same way out
        assert cli.wait(timeout=60) == 0
        assert not [c for c in children if Path(f"/proc/{c}").exists()
                    and (Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens there any more
    finally:
        if cli.poll() is None:
            cli.kill()


# --------------------------------------------------------------------------- secrets
def test_the_config_on_disk_names_the_key_s_variable_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    config = ProxyConfig([Backend("http://127.0.0.1:9/v1", "m", api_key="sk-upstream-secret-1"),
                          Backend("http://127.0.0.1:9/v1", "m")], db_path=tmp_path / "traces.db")
    run_dir = tmp_path / "run"
    path = write_config(config, run_dir)
    text = path.read_text()
    assert "sk-upstream-secret-1" not in text
    entries = json.loads(text)["model_list"]
    assert [e["litellm_params"]["api_key"] for e in entries] == ["os.environ/RLLM_PROXY_BACKEND_KEY_0", "EMPTY"]
    assert backend_key_env(config) == {"RLLM_PROXY_BACKEND_KEY_0": "sk-upstream-secret-1"}
    assert S_IMODE(run_dir.stat().st_mode) == 0o700
    for written in (path, run_dir / "hooks" / "rllm_proxy_hooks.py"):
        assert S_IMODE(written.stat().st_mode) == 0o600, written
    assert not any("sk-upstream-secret-1" in f.read_text() for f in run_dir.rglob("*") if f.is_file())


def test_the_proxy_caches_its_bytecode_in_its_own_environment_whatever_the_caller_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first start compiles LiteLLM into the proxy's environment; later starts import in half the time."""
    from rllm.tracing import proxy as proxy_module

    class Launched(Exception):
        pass

    seen: dict[str, str] = {}

    def launch(command: list[str], log: Path, *, env: dict[str, str], **kwargs: Any) -> None:
        seen.update(env)
        raise Launched

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(proxy_module, "find_proxy_venv", lambda venv=None: tmp_path / "venv")
    monkeypatch.setattr(proxy_module, "ServerProcess", launch)
    config = ProxyConfig([Backend("http://127.0.0.1:9/v1", "m")], db_path=tmp_path / "traces.db")
    with pytest.raises(Launched):
        proxy_module.ProxyProcess(config, run_dir=tmp_path / "run").start()
    assert seen["LITELLM_TELEMETRY"] == "False" and "PYTHONDONTWRITEBYTECODE" not in seen


@pytest.mark.parametrize("kind", ["vllm", "openai"])
def test_a_backend_key_reaches_the_backend_through_the_environment_only(
        proxy_venv: Path, tmp_path: Path, kind: str) -> None:
    key = "sk-upstream-secret-2"
    with KeyedOpenAIServer(key, "hello") as backend:
        config = ProxyConfig([Backend(backend.base_url, "keyed", api_key=key, kind=kind)],
                             db_path=tmp_path / "traces.db")
        with ProxyProcess(config, run_dir=tmp_path / "run", venv=proxy_venv) as running:
            reply = get_chat_client(running.base_url, running.api_key, max_retries=0).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content == "hello"
            files = [f for f in (tmp_path / "run").rglob("*") if f.is_file()]
            assert files and not any(key in f.read_text(errors="replace") for f in files)
    assert f"Bearer {key}" in backend.authorizations


def test_the_proxy_cli_takes_the_backend_key_from_the_environment_and_warns_when_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from rllm.tracing import proxy as proxy_cli

    with pytest.raises(SystemExit):
        proxy_cli.main(["start", "--help"])
    assert "$OPENAI_API_KEY" in capsys.readouterr().out
    captured: list[ProxyConfig] = []

    class _NoVenv(ProxyProcess):
        def __init__(self, config: ProxyConfig, **kwargs: Any) -> None:
            captured.append(config)
            super().__init__(config, **kwargs)

    monkeypatch.setattr(proxy_cli, "ProxyProcess", _NoVenv)
    argv = ["start", "--backend", "http://127.0.0.1:9/v1", "--served-model", "m", "--db", str(tmp_path / "t.db"),
            "--venv", str(tmp_path / "no-venv"), "--run-dir", str(tmp_path / "run")]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
        assert proxy_cli.main(argv) == 2  # no proxy environment there: a clear error, no traceback
    assert captured[-1].backends[0].api_key == "sk-from-env" and not caplog.records
    assert "error: no LiteLLM proxy environment" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="rllm.secret_options"):
        assert proxy_cli.main([*argv, "--backend-api-key", "sk-typed"]) == 2
    assert captured[-1].backends[0].api_key == "sk-typed"
    (record,) = caplog.records
    assert record.getMessage() == ("--backend-api-key on the command line is visible to every user of this machine "
                                   "(ps); set OPENAI_API_KEY in the environment instead")
