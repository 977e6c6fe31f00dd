"""Measure what trace capture costs: added latency per call and sustained store throughput.

One run starts a scripted OpenAI-compatible server and two LiteLLM proxies in front of it: one with
capture on, one identical but with capture off (same provider, no store, no callback). Calls go
round-robin to the server directly, through the bare proxy and through the capturing proxy, so
drift on a shared machine hits all three alike; the report gives the proxy's own added latency and
the capture's cost on top, then calls per second under concurrent sessions. Then it writes traces
into a ``TraceStore`` from several threads and reports committed traces per second.

    python scripts/bench_proxy.py [--calls 300] [--store-traces 20000] [--json out.json]

Needs the proxy environment (``python -m rllm.tracing.proxy install``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ToyChatTokens
from rllm.tracing import Backend, ProxyConfig, ProxyProcess, TraceStore, get_chat_client, get_chat_client_async, session

MESSAGES = [{"role": "system", "content": "You are a search agent. " * 20},
            {"role": "user", "content": "Which city hosted the first modern Olympic Games?"}]


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(ordered[int(0.9 * len(ordered))], 3),
            "mean_ms": round(statistics.fmean(ordered), 3)}


def _call(client: openai.OpenAI, stream: bool) -> None:
    if stream:
        for _ in client.chat.completions.create(model="policy", messages=MESSAGES, stream=True):
            pass
    else:
        client.chat.completions.create(model="policy", messages=MESSAGES)


def bench_latency(calls: int, warmup: int, stream: bool, clients: dict[str, openai.OpenAI]) -> dict[str, Any]:
    """Per-call latency of each route, interleaved call by call."""
    samples: dict[str, list[float]] = {name: [] for name in clients}
    with session("bench"):
        for i in range(warmup + calls):
            for name, client in clients.items():
                start = time.perf_counter()
                _call(client, stream)
                if i >= warmup:
                    samples[name].append((time.perf_counter() - start) * 1000.0)
    out: dict[str, Any] = {name: _summary(values) for name, values in samples.items()}
    direct, bare, captured = (out[k]["median_ms"] for k in ("direct", "proxy_capture_off", "proxy_capture_on"))
    out["proxy_added_ms"] = round(bare - direct, 3)
    out["capture_added_ms"] = round(captured - bare, 3)
    paired = [c - b for c, b in zip(samples["proxy_capture_on"], samples["proxy_capture_off"])]
    out["capture_added_paired_median_ms"] = round(statistics.median(paired), 3)
    return out


async def _throughput(base_url: str, api_key: str, sessions: int, calls: int) -> float:
    """Calls per second with ``sessions`` concurrent sessions of ``calls`` sequential calls each."""
    client = get_chat_client_async(base_url, api_key, max_retries=0)

    async def one(i: int) -> None:
        async with session(f"load-{i}"):
            for _ in range(calls):
                await client.chat.completions.create(model="policy", messages=MESSAGES)

    await one(-1)  # warm the pool
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sessions)))
    elapsed = time.perf_counter() - start
    await client.close()
    return sessions * calls / elapsed


def bench_throughput(proxies: dict[str, ProxyProcess], sessions: int, calls: int) -> dict[str, Any]:
    """Calls (and so traces) per second through each proxy under concurrent sessions."""
    out: dict[str, Any] = {"sessions": sessions, "calls_per_session": calls}
    for name, proxy in proxies.items():
        out[f"{name}_calls_per_second"] = round(asyncio.run(_throughput(proxy.base_url, proxy.api_key,
                                                                        sessions, calls)), 1)
    return out


def bench_store(traces: int, writers: int, directory: Path) -> dict[str, Any]:
    """Committed traces per second with ``writers`` threads putting realistic traces (~4 KB each)."""
    prompt_ids = list(range(1500, 1800))
    template = {"session_id": "", "seq": 0, "no_session": False, "latency_ms": 12.5, "model": "m", "backend": "b",
                "request": {"messages": MESSAGES + [{"role": "tool", "content": "passage " * 150}],
                            "tools": [], "sampling": {"temperature": 1.0}, "stream": False},
                "response": {"message": {"role": "assistant", "content": "answer " * 30},
                             "prompt_token_ids": prompt_ids, "completion_token_ids": list(range(64)),
                             "logprobs": [-0.25] * 64, "finish_reason": "stop", "usage": {}}, "error": None}
    size = len(json.dumps(template))
    store = TraceStore(directory / "bench.db")
    per_writer = traces // writers

    def write(w: int) -> None:
        for seq in range(per_writer):
            store.put({**template, "trace_id": f"{w}-{seq}", "session_id": f"s{w}", "seq": seq})

    start = time.perf_counter()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.flush()
    elapsed = time.perf_counter() - start
    total = store.count()
    store.close()
    return {"traces": total, "writers": writers, "trace_bytes": size, "seconds": round(elapsed, 3),
            "traces_per_second": round(total / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=32, help="concurrent sessions for the throughput run")
    parser.add_argument("--session-calls", type=int, default=10)
    parser.add_argument("--store-traces", type=int, default=20_000)
    parser.add_argument("--store-writers", type=int, default=8)
    parser.add_argument("--venv", help="the proxy environment (default $RLLM_PROXY_VENV or .cache/litellm-venv)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rllm-bench-") as tmp, \
            ScriptedOpenAIServer(ToyChatTokens.wrap(lambda body: ScriptedReply(content="Athens."))) as server:
        directory = Path(tmp)
        backends = [Backend(server.base_url, "scripted")]
        proxies = {name: ProxyProcess(ProxyConfig(backends, directory / f"{name}.db", capture=capture),
                                      run_dir=directory / name, venv=args.venv)
                   for name, capture in (("proxy_capture_off", False), ("proxy_capture_on", True))}
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: p.start(), proxies.values()))
        try:
            clients = {"direct": get_chat_client(server.base_url, "none", max_retries=0),
                       **{name: get_chat_client(p.base_url, p.api_key, max_retries=0) for name, p in proxies.items()}}
            for stream in (False, True):
                key = "streamed" if stream else "non_streamed"
                results[key] = bench_latency(args.calls, args.warmup, stream, clients)
                print(f"{key}: " + json.dumps(results[key]), flush=True)
            results["throughput"] = bench_throughput(proxies, args.sessions, args.session_calls)
            print("throughput: " + json.dumps(results["throughput"]), flush=True)
            with TraceStore(proxies["proxy_capture_on"].config.db_path) as store:
                results["captured_traces"] = store.count()
            print(f"captured traces: {results['captured_traces']}", flush=True)
        finally:
            for p in proxies.values():
                p.close()
        results["store"] = bench_store(args.store_traces, args.store_writers, directory)
        print("store: " + json.dumps(results["store"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
