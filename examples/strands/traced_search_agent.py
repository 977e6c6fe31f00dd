"""Capture a stock Strands agent's rollout through the LiteLLM proxy, then print its trajectory.

The HotpotQA search agent is a plain ``strands.Agent`` with ``OpenAIModel`` (streaming) or
``NonStreamingOpenAIModel``; its only change is the client: ``get_chat_client_async`` tags each
request with the session id. The proxy (its own environment, see ``python -m rllm.tracing.proxy
install``) records every call into SQLite; the rollout is then read back as an ordered
``Trajectory`` with exact token ids, merged into one token sequence when the prompts extend.

    python examples/strands/traced_search_agent.py                        # offline: embedded scripted model
    python examples/strands/traced_search_agent.py --base-url http://127.0.0.1:30000/v1 --model Qwen/Qwen3-4B

Retrieval: ``--retrieval-url``, else the embedded index over the shipped HotpotQA paragraphs
(``rag/launch_rag.sh``, built once on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from strands import Agent
from strands.models.openai import OpenAIModel

from rllm.agents.search import SEARCH_SYSTEM_PROMPT, format_question, scripted_search_reply, search_tools
from rllm.data.hotpotqa import load_hotpotqa
from rllm.eval.search import RetrievalProcess
from rllm.integrations.strands import NonStreamingOpenAIModel
from rllm.offline.scripted_server import ScriptedOpenAIServer, ToyChatTokens
from rllm.rewards.search_reward import RewardSearchFn
from rllm.secret_options import add_secret_argument
from rllm.tracing import Backend, ProxyConfig, ProxyProcess, TraceStore, get_chat_client_async, load_trajectory, session
from rllm.tracing.trajectory import SessionTrajectory

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def model_backend(args: argparse.Namespace) -> Iterator[Backend]:
    """``--base-url`` as given, else an embedded scripted model that serves vLLM-style token ids."""
    if args.base_url:
        yield Backend(args.base_url, args.model, api_key=args.api_key, kind=args.kind)
        return
    with ScriptedOpenAIServer(ToyChatTokens.wrap(scripted_search_reply), model="scripted-search") as server:
        yield Backend(server.base_url, "scripted-search")


@contextlib.contextmanager
def retrieval_url(args: argparse.Namespace, run_dir: Path) -> Iterator[str]:
    if args.retrieval_url:
        yield args.retrieval_url
        return
    with RetrievalProcess(run_dir / "retrieval.log") as server:
        server.wait_ready()
        yield server.url


async def rollout(proxy: ProxyProcess, store: TraceStore, task: dict[str, Any], url: str,
                  args: argparse.Namespace) -> tuple[str, str]:
    """Run the unchanged agent on one task inside a session; return the session id and the final answer."""
    client = get_chat_client_async(proxy.base_url, proxy.api_key)
    model_cls = NonStreamingOpenAIModel if args.no_stream else OpenAIModel
    model = model_cls(client=client, model_id=proxy.config.model_name,
                      params={"temperature": args.temperature, "max_tokens": args.max_tokens})
    agent = Agent(model=model, tools=search_tools(url), system_prompt=SEARCH_SYSTEM_PROMPT, callback_handler=None)
    # Task data (the answer included) stays in this process and in the store's session row; only the
    # opaque session id travels with the requests.
    async with session(f"hotpotqa-{task['id']}", store=store, task=task) as s:
        result = await agent.invoke_async(format_question(task))
    await client.close()
    return s.id, str(result).strip()


def print_trajectory(rebuilt: SessionTrajectory, reward: Any) -> None:
    for step in rebuilt.trajectory.steps:
        out = step.model_output
        action = ", ".join(f"{c.name}({json.dumps(c.input)})" for c in out.tool_calls) or repr(out.text[:120])
        print(f"  call {step.info['seq']}: {len(step.messages)} messages in, "
              f"{len(out.prompt_ids or [])} prompt / {len(out.completion_ids or [])} completion tokens, "
              f"{'streamed' if step.info['stream'] else 'non-streamed'}, {step.info['latency_ms']:.1f} ms -> {action}")
        for obs in step.observation:
            print(f"      tool result: {str(obs.get('content'))[:100]!r}")
    print("  capture:", json.dumps(rebuilt.report()))
    for i, trace in enumerate(rebuilt.token_traces):
        print(f"  token sequence {i}: {len(trace)} tokens, {sum(trace.loss_mask)} sampled (loss mask 1), "
              f"{trace.num_turns} model calls, prompt {trace.prompt_length} tokens")
    print(f"  reward: {reward.reward} (correct: {reward.is_correct})")


async def main_async(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    task = load_hotpotqa(limit=args.task_index + 1)[args.task_index]
    with model_backend(args) as backend, retrieval_url(args, run_dir) as url:
        config = ProxyConfig([backend], db_path=run_dir / "traces.db")
        with ProxyProcess(config, run_dir=run_dir / "proxy", venv=args.venv) as proxy, \
                TraceStore(config.db_path) as store:
            print(f"proxy {proxy.base_url} -> {backend.api_base} (log: {proxy.log_path})")
            session_id, answer = await rollout(proxy, store, task, url, args)
            rebuilt = load_trajectory(store, session_id, task=task)
    print(f"\nquestion: {task['question']}\nanswer:   {answer}\ngold:     {task['answer']}")
    print(f"session {session_id}: {len(rebuilt.trajectory.steps)} calls captured in {config.db_path}")
    print_trajectory(rebuilt, RewardSearchFn()(task, answer))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible model server (default: embedded scripted model)")
    parser.add_argument("--model", default="Qwen/Qwen3-4B", help="the name the server expects")
    add_secret_argument(parser, "--api-key", env="OPENAI_API_KEY", help="the server's API key")
    parser.add_argument("--kind", choices=["vllm", "openai"], default="vllm",
                        help="vllm: exact token ids and logprobs; openai: any other OpenAI-compatible API")
    parser.add_argument("--retrieval-url", help="a running retrieval server (default: the embedded index)")
    parser.add_argument("--task-index", type=int, default=0, help="which question of the HotpotQA sample")
    parser.add_argument("--no-stream", action="store_true", help="NonStreamingOpenAIModel instead of OpenAIModel")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--venv", help="the proxy environment (default $RLLM_PROXY_VENV or .cache/litellm-venv)")
    parser.add_argument("--run-dir", default=str(REPO / "runs" / "traced_search"))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
