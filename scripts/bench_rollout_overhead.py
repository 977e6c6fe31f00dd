"""How much the rollout framework costs per model turn, next to a plain Strands agent loop.

N agents run concurrently (default 256), each making three tool calls and then answering, so
every agent makes four model calls. Four set-ups run, each in a fresh subprocess so peak memory
is its own:

- ``strands+OpenAIModel/http``: plain ``strands.Agent`` with Strands' ``OpenAIModel`` against the
  scripted server (the baseline a Strands user has today);
- ``rllm/http``: ``StrandsAgent`` + ``RLLMModel`` + ``OpenAIEngine`` against the same server;
- ``strands+RLLMModel/instant`` and ``rllm/instant``: the same agents over an in-process engine
  that answers instantly, so what remains is framework time (Strands' loop alone, then with
  rllm's recording, budget and validation hooks on top).

The scripted server runs in its own process, so the CPU time measured is the client's. Figures
are ratios against the baseline measured in the same run; absolute numbers depend on the machine.

    python scripts/bench_rollout_overhead.py [--agents 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from strands import Agent, tool
from strands.models.openai import OpenAIModel

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from rllm.types import ModelOutput, ToolCall

logger = logging.getLogger("bench_rollout_overhead")

TOOL_TURNS = 3
SETUPS = ("strands+OpenAIModel/http", "rllm/http", "strands+RLLMModel/instant", "rllm/instant")


@tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Anything.
    """
    return text


def _turn(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def policy(body: dict[str, Any]) -> ScriptedReply:
    """Three tool calls, then a final answer; stateless so it serves any number of agents."""
    turn = _turn(body["messages"])
    if turn < TOOL_TURNS:
        return ScriptedReply(tool_calls=[ScriptedToolCall("echo", json.dumps({"text": f"turn {turn}"}))])
    return ScriptedReply(content="done \\boxed{42}")


class InstantEngine:
    """A rollout engine that answers at once, in process, with the same policy."""

    def __init__(self) -> None:
        self._ids = 0

    async def get_model_response(self, messages: list[dict[str, Any]], tools: Any = None, **sampling: Any) -> ModelOutput:
        reply = policy({"messages": messages})
        self._ids += 1
        return ModelOutput(
            text=reply.content or "",
            tool_calls=[ToolCall.from_arguments(f"call_{self._ids}", c.name, c.arguments) for c in reply.tool_calls],
            finish_reason="tool_calls" if reply.tool_calls else "stop",
        )


def _build_agent(setup: str, base_url: str, engine: Any) -> Agent:
    if setup == "strands+OpenAIModel/http":
        model = OpenAIModel(client_args={"base_url": base_url, "api_key": "x"}, model_id="scripted")
        return Agent(model=model, tools=[echo], callback_handler=None)
    if setup == "strands+RLLMModel/instant":
        return Agent(model=RLLMModel(engine), tools=[echo], callback_handler=None)
    return StrandsAgent(RLLMModel(engine), tools=[echo])


async def _run_setup(setup: str, agents: int, base_url: str) -> dict[str, float]:
    engine = InstantEngine() if setup.endswith("/instant") else OpenAIEngine(model="scripted", base_url=base_url)
    pool = [_build_agent(setup, base_url, engine) for _ in range(agents)]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(agent.invoke_async(f"task {i}") for i, agent in enumerate(pool)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    turns = agents * (TOOL_TURNS + 1)
    for agent in pool:
        if _turn(agent.messages) != TOOL_TURNS + 1:
            raise RuntimeError(f"{setup}: an agent made {_turn(agent.messages)} model calls, expected {TOOL_TURNS + 1}")
        if isinstance(agent, StrandsAgent) and len(agent.trajectory.steps) != TOOL_TURNS + 1:
            raise RuntimeError(f"{setup}: trajectory has {len(agent.trajectory.steps)} steps")
    return {
        "turns_per_s": turns / wall,
        "cpu_ms_per_turn": 1000 * cpu / turns,
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024,
    }


def _serve(ready: Any) -> None:
    server = ScriptedOpenAIServer(policy).start()
    ready.put(server.base_url)
    while True:
        time.sleep(3600)


def _child(setup: str, agents: int, base_url: str) -> None:
    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(_run_setup(setup, agents, base_url))))  # read by the parent process


def main() -> None:
    """Run every set-up ``--repeats`` times and log the medians as a table with ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.agents, args.base_url)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    ready: Any = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(ready,), daemon=True)
    server.start()
    base_url = ready.get(timeout=60)
    results: dict[str, list[dict[str, float]]] = {setup: [] for setup in SETUPS}
    try:
        for repeat in range(args.repeats):
            for setup in SETUPS:  # interleaved, so drift in machine load hits every set-up alike
                out = subprocess.run(
                    [sys.executable, __file__, "--child", setup, "--agents", str(args.agents), "--base-url", base_url],
                    check=True, capture_output=True, text=True, env={**os.environ, "OTEL_SDK_DISABLED": "true"},
                )
                results[setup].append(json.loads(out.stdout.strip().splitlines()[-1]))
                logger.info("repeat %d %-28s %s", repeat, setup, results[setup][-1])
    finally:
        server.terminate()

    median = {s: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for s, runs in results.items()}
    base = median["strands+OpenAIModel/http"]
    logger.info("\n%d agents x %d model turns, median of %d runs", args.agents, TOOL_TURNS + 1, args.repeats)
    logger.info("%-28s %10s %8s %14s %8s %12s", "setup", "turns/s", "ratio", "cpu ms/turn", "ratio", "peak RSS MB")
    for setup, m in median.items():
        logger.info("%-28s %10.0f %7.2fx %14.2f %7.2fx %12.0f", setup, m["turns_per_s"],
                    m["turns_per_s"] / base["turns_per_s"], m["cpu_ms_per_turn"],
                    m["cpu_ms_per_turn"] / base["cpu_ms_per_turn"], m["peak_rss_mb"])
    plain, ours = median["strands+RLLMModel/instant"], median["rllm/instant"]
    logger.info("rllm recording + hooks on top of Strands' own loop: %+.2f ms CPU per turn (%.2fx)",
                ours["cpu_ms_per_turn"] - plain["cpu_ms_per_turn"], ours["cpu_ms_per_turn"] / plain["cpu_ms_per_turn"])


if __name__ == "__main__":
    main()
