"""Does the training sequence equal what the policy saw and sampled? TITO against re-rendering.

Runs K multi-turn, tool-using rollouts of a real Strands agent through ``RLLMModel`` on a token
engine whose policy is scripted text emitted through a real tokenizer with a Qwen3-style chat
template (the tiny one from ``rllm.testing.tiny_models``, built offline in seconds). Each rollout
reasons in ``<think>`` blocks, makes one to three tool calls, and half of them get a second user
turn. For every rollout two training sequences are compared with what the model actually saw
and sampled (each call's prompt followed by its sampled tokens):

- TITO: the ``TokenTrace`` the engine built incrementally;
- re-render: the final conversation rendered by the chat template and tokenized again, which is
  how integrations without token-in/token-out rebuild the sequence.

It reports how many rollouts drift and how many tokens differ. TITO must show zero.

    python scripts/drift_audit.py [--rollouts 64] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import logging
import random
from typing import Any

from strands import tool

from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.integrations.strands._format import format_messages
from rllm.testing.scripted_tokens import ScriptedTokenEngine
from rllm.testing.tiny_models import build_tiny_tokenizer

logger = logging.getLogger("drift_audit")


@tool
def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: What to look up.
    """
    return {"status": "success", "content": [{"text": f"{key} is {len(key)}"}, {"json": {"key": key}}]}


def _policy(tool_turns: int, rng: random.Random) -> Any:
    """A scripted policy: think, call the tool ``tool_turns`` times per user turn, then answer."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]

    def script(prompt: str) -> str:
        responses = 0  # tool responses since the last real user turn
        for turn in reversed(prompt.split("<|im_start|>")):
            if turn.startswith("user\n"):
                if "<tool_response>" not in turn:
                    break
                responses += turn.count("<tool_response>")
        thought = f"<think>\nStep {responses}: {rng.choice(words)} then {rng.choice(words)}.\n</think>\n\n"
        if responses < tool_turns:
            key = rng.choice(words)
            return thought + f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'
        return thought + f"The answer is \\boxed{{{rng.randint(0, 99)}}}."

    return script


def _differing_tokens(a: list[int], b: list[int]) -> int:
    matched = sum(block.size for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks())
    return max(len(a), len(b)) - matched


async def _rollout(tokenizer: Any, index: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed * 100_003 + index)
    engine = ScriptedTokenEngine(tokenizer, _policy(rng.randint(1, 3), rng))
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup], system_prompt="Answer in \\boxed{}.")
    await agent.invoke_async(f"Question {index}: what is the value?")
    if index % 2:
        await agent.invoke_async("Check it once more.")
    trace = agent.trajectory.token_trace
    steps = agent.trajectory.steps
    # What the model saw and sampled: the last call's prompt followed by its sampled tokens; every
    # earlier call's prompt + sample must be a prefix of it for one sequence to stand for all.
    seen = steps[-1].model_output.prompt_ids + steps[-1].model_output.completion_ids
    consistent = all(
        seen[: len(s.model_output.prompt_ids) + len(s.model_output.completion_ids)]
        == s.model_output.prompt_ids + s.model_output.completion_ids
        for s in steps
    )
    if not consistent:
        raise RuntimeError(f"rollout {index}: the model's own prompts are not prefixes of one another")
    conversation = format_messages(agent.messages, agent.system_prompt)
    rerendered = engine.renderer.encode(engine.renderer.render_text(conversation, steps[-1].tools, False))
    separator = engine.renderer.encode(engine.renderer.probe.separator)
    if separator and rerendered[-len(separator) :] == separator:  # the template's trailing newline is no drift
        rerendered = rerendered[: -len(separator)]
    return {
        "turns": len(steps),
        "tito_diff": _differing_tokens(trace.token_ids, seen),
        "rerender_diff": _differing_tokens(rerendered, seen),
        "tokens": len(seen),
    }


async def _audit(rollouts: int, seed: int) -> list[dict[str, int]]:
    tokenizer = build_tiny_tokenizer()
    return [await _rollout(tokenizer, i, seed) for i in range(rollouts)]


def main() -> None:
    """Run the audit and log a side-by-side summary (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = asyncio.run(_audit(args.rollouts, args.seed))
    summary = {
        "rollouts": len(results),
        "model_calls": sum(r["turns"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
        "tito_drifting_rollouts": sum(r["tito_diff"] > 0 for r in results),
        "tito_differing_tokens": sum(r["tito_diff"] for r in results),
        "rerender_drifting_rollouts": sum(r["rerender_diff"] > 0 for r in results),
        "rerender_differing_tokens": sum(r["rerender_diff"] for r in results),
    }
    logger.info("%d rollouts, %d model calls, %d tokens (tiny Qwen3-style template, scripted policy)",
                summary["rollouts"], summary["model_calls"], summary["tokens"])
    logger.info("%-12s %18s %18s", "method", "drifting rollouts", "differing tokens")
    logger.info("%-12s %18d %18d", "TITO", summary["tito_drifting_rollouts"], summary["tito_differing_tokens"])
    logger.info("%-12s %18d %18d", "re-render", summary["rerender_drifting_rollouts"], summary["rerender_differing_tokens"])
    if args.json:
        print(json.dumps(summary))  # machine-readable result on stdout


if __name__ == "__main__":
    main()
