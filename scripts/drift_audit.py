"""Does the training sequence equal what the policy saw and sampled? TITO against re-rendering.

Runs K multi-turn, tool-using rollouts of a real Strands agent through ``RLLMModel`` on a token
engine, with Qwen's real tokenizer and the chat template the model family ships (trl's copy; see
``rllm.offline.chat_templates``). The scripted policy samples what the template writes for its
messages: it reasons where the template thinks, makes one to three rounds of one or two parallel
tool calls, and half of the rollouts get a second user turn. As real models sometimes do, a
quarter of its Hermes tool calls are written in compact JSON (``{"key":"x"}``) rather than the
template's own spacing. For every rollout two training sequences are compared with what the model
actually saw and sampled (the last call's prompt followed by its sampled tokens):

- TITO: the ``TokenTrace`` the engine built incrementally;
- re-render: the final conversation rendered by the chat template and tokenized again, which is
  how integrations without token-in/token-out rebuild the sequence.

It reports how many rollouts drift and how many tokens differ. TITO must show zero.

    python scripts/drift_audit.py [--family qwen3] [--all-families] [--rollouts 64] [--seed 0] [--json]
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
from rllm.offline.chat_templates import FAMILIES, TemplateFamily
from rllm.offline.scripted_tokens import MessageScriptedEngine

logger = logging.getLogger("drift_audit")

_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


@tool
def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: What to look up.
    """
    return {"status": "success", "content": [{"text": f"{key} is {len(key)}"}, {"json": {"key": key, "ok": True}}]}


def _call(key: str, n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}


def _policy(family: TemplateFamily, think: bool, prefilled: bool, tool_rounds: int, rng: random.Random) -> Any:
    """Think (where the template does), call the tool ``tool_rounds`` times per user turn, then answer."""

    def script(messages: list[dict[str, Any]]) -> dict[str, Any] | str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        rounds = sum(1 for m in messages[last_user:] if m["role"] == "assistant")
        thought = f"Step {rounds}: {rng.choice(_WORDS)} then {rng.choice(_WORDS)}."
        if rounds < tool_rounds:
            keys = [rng.choice(_WORDS) for _ in range(rng.randint(1, 2))]
            if family.tool_parser == "hermes" and rng.random() < 0.25:  # compact JSON, as models sometimes write
                think_text = ("" if not think else f"{thought}\n</think>\n\n" if prefilled
                              else f"<think>\n{thought}\n</think>\n\n")
                calls = "\n".join(f'<tool_call>\n{{"name":"lookup","arguments":{{"key":"{k}"}}}}\n</tool_call>' for k in keys)
                return think_text + calls
            message: dict[str, Any] = {"content": "", "tool_calls": [_call(k, i) for i, k in enumerate(keys)]}
        else:
            message = {"content": f"The answer is \\boxed{{{rng.randint(0, 99)}}}."}
        return {**message, "reasoning_content": thought} if think else message

    return script


def _differing_tokens(a: list[int], b: list[int]) -> int:
    matched = sum(block.size for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks())
    return max(len(a), len(b)) - matched


async def _rollout(family: TemplateFamily, tokenizer: Any, index: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed * 100_003 + index)
    engine = MessageScriptedEngine(tokenizer, lambda messages: "", tool_parser=family.tool_parser)
    renderer = engine.renderer
    generation_prompt = renderer.render_text([{"role": "user", "content": "x"}], None, True)
    think = family.thinking and "</think>" not in generation_prompt
    engine.script = _policy(family, think, renderer.probe.think_prefilled, rng.randint(1, 3), rng)
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
    text = renderer.render_text(format_messages(agent.messages, agent.system_prompt), steps[-1].tools, False)
    end = renderer.probe.end_of_turn_text
    rerendered = renderer.encode(text[: text.rindex(end) + len(end)])  # what follows the last turn is no drift
    return {
        "turns": len(steps),
        "tito_diff": _differing_tokens(trace.token_ids, seen),
        "rerender_diff": _differing_tokens(rerendered, seen),
        "tokens": len(seen),
    }


async def audit_family(name: str, rollouts: int, seed: int) -> list[dict[str, int]]:
    """Per-rollout results for one template family."""
    family = FAMILIES[name]
    tokenizer = family.tokenizer()
    return [await _rollout(family, tokenizer, i, seed) for i in range(rollouts)]


def summarize(name: str, results: list[dict[str, int]]) -> dict[str, Any]:
    """Totals over one family's rollouts."""
    return {
        "family": name,
        "rollouts": len(results),
        "model_calls": sum(r["turns"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
        "tito_drifting_rollouts": sum(r["tito_diff"] > 0 for r in results),
        "tito_differing_tokens": sum(r["tito_diff"] for r in results),
        "rerender_drifting_rollouts": sum(r["rerender_diff"] > 0 for r in results),
        "rerender_differing_tokens": sum(r["rerender_diff"] for r in results),
    }


def main() -> None:
    """Run the audit and log a side-by-side summary per family (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen3", choices=sorted(FAMILIES), help="template family (default qwen3)")
    parser.add_argument("--all-families", action="store_true", help="audit every family in rllm.offline.chat_templates")
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the summaries as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = list(FAMILIES) if args.all_families else [args.family]
    summaries = [summarize(name, asyncio.run(audit_family(name, args.rollouts, args.seed))) for name in names]
    logger.info("real Qwen tokenizer, shipped chat templates, scripted policy, %d rollouts per family", args.rollouts)
    logger.info("%-20s %7s | %-22s | %-22s", "family", "tokens", "TITO: drifting / tokens", "re-render: drifting / tokens")
    for s in summaries:
        logger.info("%-20s %7d | %10d / %-9d | %10d / %-9d", s["family"], s["tokens"], s["tito_drifting_rollouts"],
                    s["tito_differing_tokens"], s["rerender_drifting_rollouts"], s["rerender_differing_tokens"])
    if args.json:
        print(json.dumps(summaries))  # machine-readable result on stdout


if __name__ == "__main__":
    main()
