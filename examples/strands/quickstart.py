"""Run a Strands agent with a calculator tool through rllm and save its recorded episode.

With ``--base-url`` the agent talks to any OpenAI-compatible endpoint (vLLM, SGLang, LiteLLM, a
hosted API). Without it, an embedded scripted server on 127.0.0.1 plays the model (it calls the
calculator once, then answers with the tool's result), so the whole path runs offline: a real
Strands agent loop, real HTTP, real tool execution, one recorded ``Step`` per model call.

    python examples/strands/quickstart.py
    python examples/strands/quickstart.py --base-url http://127.0.0.1:30000/v1 --model Qwen/Qwen3-4B --vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from rllm.engine.rollout import OpenAIEngine
from rllm.integrations.strands import Budget, RLLMModel, StrandsAgent
from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from rllm.secret_options import add_secret_argument
from rllm.tools import calculator
from rllm.types import Episode

logger = logging.getLogger("quickstart")

SYSTEM_PROMPT = "You are a precise assistant. Use the calculator for arithmetic. Put the final answer in \\boxed{}."
def scripted_policy(body: dict[str, Any]) -> ScriptedReply:
    """Stand-in for a model: call the calculator on the question, then box the tool's answer."""
    tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
    if tool_messages:
        return ScriptedReply(content=f"The result is \\boxed{{{tool_messages[-1]['content']}}}.")
    question = body["messages"][-1]["content"]
    text = question if isinstance(question, str) else "".join(part.get("text", "") for part in question)
    expression = text.split("What is", 1)[-1].rstrip("?").strip()
    return ScriptedReply(
        reasoning_content="This needs arithmetic, so I will use the calculator.",
        tool_calls=[ScriptedToolCall("calculator", json.dumps({"expression": expression}))],
    )


async def run(args: argparse.Namespace) -> Episode:
    """Run the agent once and return its episode."""
    engine = OpenAIEngine(model=args.model, base_url=args.base_url, api_key=args.api_key,
                          return_token_ids=args.vllm, temperature=args.temperature, max_tokens=args.max_tokens)
    agent = StrandsAgent(RLLMModel(engine), tools=[calculator], system_prompt=SYSTEM_PROMPT,
                         budget=Budget(max_model_turns=args.max_turns))
    result = await agent.invoke_async(args.question)
    trajectory = agent.trajectory
    trajectory.task = {"question": args.question}
    return Episode(
        id="quickstart:0",
        task=trajectory.task,
        trajectories=[trajectory],
        termination_reason=agent.termination_reason,
        metrics={"model_calls": len(trajectory.steps),
                 "tool_calls": sum(len(step.tool_calls) for step in trajectory.steps)},
        info={"final_answer": str(result).strip()},
    )


def main() -> None:
    """Parse arguments, run the agent against the given or the embedded endpoint, save the episode."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint; omit to use the embedded scripted server")
    parser.add_argument("--model", default="scripted", help="model name sent to the endpoint")
    add_secret_argument(parser, "--api-key", env="OPENAI_API_KEY", default="EMPTY", help="the endpoint's API key")
    parser.add_argument("--vllm", action="store_true", help="ask vLLM for token ids and logprobs")
    parser.add_argument("--question", default="What is 17 * 23 + 4?")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart/episode.json"))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    server = None
    if args.base_url is None:
        server = ScriptedOpenAIServer(scripted_policy).start()
        args.base_url = server.base_url
        logger.info("no --base-url given: a scripted model at %s plays the policy", args.base_url)
    try:
        episode = asyncio.run(run(args))
    finally:
        if server is not None:
            server.stop()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(episode.model_dump_json(indent=2))
    for index, step in enumerate(episode.trajectories[0].steps):
        calls = ", ".join(f"{c.name}({c.arguments})" for c in step.tool_calls) or "-"
        logger.info("step %d: %d messages sent, tool calls: %s, answer: %r, observation: %s", index,
                    len(step.messages), calls, step.model_output.text,
                    [o["content"] for o in step.observation])
    logger.info("final answer: %s", episode.info["final_answer"])
    logger.info("termination: %s; episode written to %s", episode.termination_reason.value, args.out)


if __name__ == "__main__":
    main()
