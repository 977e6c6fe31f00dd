"""Rollouts/s of the embedded ``TransformersEngine``: continuous batching against one request at a time.

Each rollout is a real Strands agent episode through the project's runner
(``rllm.training.local.run_rollouts``: ``build_agent``, ``RLLMModel``, ``run_rollout``) on the
two-hop lookup task of the learning proof, with its ``lookup`` tool. The model is a random-init
Qwen3 (default hidden 256, 4 layers, as the learning proof) that samples every call (seeded,
temperature 1, ``--max-tokens`` per call). Random weights never write a tool call, so each
answer is read as a call of ``lookup`` (the sampled tokens stay in the trace as they are): every
rollout makes ``--turns`` model calls, runs its tool after each, and ends cleanly on its turn
budget (``max_turns``).

At each concurrency N, N rollouts start together (in waves until ``--min-rollouts`` ran) on the
batched engine (``max_batch_size=64``) and on the serial path (``max_batch_size=1``, the same
engine one request at a time). Both sample the same tokens (per-rollout seeds), so the work is
identical; the table gives rollouts/s, sampled tokens/s and their ratio. The log adds the
engine's own split (``BatchStats``): prompt tokens prefilled, how many of them a shared prefix
saved, and the seconds spent in prefill and in decode.

    python scripts/bench_transformers_engine.py [--device cpu|cuda] [--vocab tiny|qwen]
        [--hidden 256] [--layers 4] [--concurrency 1,8,32,64] [--dtype float32] [--threads N] [--out FILE]

On a CPU that other processes also use, ``--threads 1`` avoids OpenMP threads waiting on each
other (which can slow a small model's forward many times over).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch

from rllm.agents.lookup import LOOKUP_SYSTEM_PROMPT, LookupWorld, lookup_tools
from rllm.engine.rollout.transformers_engine import TransformersEngine
from rllm.integrations.strands import Budget
from rllm.training.local.rollouts import Rollout, RolloutRequest, run_rollouts
from rllm.types import ModelOutput, TerminationReason, ToolCall

logger = logging.getLogger("bench_transformers_engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = {"batched": 64, "serial": 1}
"""Engine set-ups: name -> ``max_batch_size``."""


class LookupCallingEngine(TransformersEngine):
    """A ``TransformersEngine`` whose every answer is read as a call of ``lookup``.

    The model samples as usual (tokens and logprobs go into the trace); only the parse is
    replaced, since random weights never write a well-formed tool call.
    """

    async def get_model_response(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                                 **sampling: Any) -> ModelOutput:
        output = await super().get_model_response(messages, tools, **sampling)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        session = sampling["session"]
        call = ToolCall.from_arguments(session.call_ids(), "lookup", json.dumps({"key": f"box {turn + 1}"}))
        return output.model_copy(update={"tool_calls": [call], "finish_reason": "tool_calls"})


@dataclass
class Cell:
    """One measurement: a set-up at a concurrency."""

    mode: str
    concurrency: int
    rollouts: int
    seconds: float
    model_calls: int
    sampled_tokens: int
    mean_batch: float
    max_batch: int
    prefill_tokens: int
    shared_prefix_tokens: int
    prefill_seconds: float
    decode_seconds: float

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "rollouts_per_s": self.rollouts_per_s, "tokens_per_s": self.tokens_per_s}


def build_model(vocab: str, hidden: int, layers: int, device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """The tokenizer (tiny BPE or Qwen's real one, Qwen3's template) and a random-init Qwen3 on ``device``."""
    from rllm.offline.tiny_models import build_tiny_qwen3, build_tiny_tokenizer

    if vocab == "tiny":
        tokenizer = build_tiny_tokenizer()
    else:
        from rllm.offline.chat_templates import FAMILIES

        tokenizer = FAMILIES["qwen3"].tokenizer()
    model = build_tiny_qwen3(tokenizer, hidden_size=hidden, num_layers=layers)
    return tokenizer, model.to(device=device, dtype=dtype)


async def run_wave(engine: TransformersEngine, world: LookupWorld, count: int, first_seed: int, args: argparse.Namespace) -> list[Rollout]:
    """``count`` rollouts started together."""
    tools = lookup_tools(world)
    budget = Budget(max_model_turns=args.turns)
    requests = [
        RolloutRequest(f"What is the code of the item in box {(first_seed + i) % 100 + 1}? Answer with \\boxed{{}}.",
                       str(first_seed + i), {"temperature": 1.0, "max_tokens": args.max_tokens, "seed": first_seed + i})
        for i in range(count)
    ]
    return await run_rollouts(engine, requests, tools=tools, system_prompt=LOOKUP_SYSTEM_PROMPT, budget=budget,
                              response_length=args.turns * (args.max_tokens + 200))


def measure(engine: TransformersEngine, world: LookupWorld, mode: str, concurrency: int, args: argparse.Namespace) -> Cell:
    """Run waves of ``concurrency`` rollouts until ``--min-rollouts`` ran; check each ended on its turn budget."""
    waves = max(1, math.ceil(args.min_rollouts / concurrency))
    engine.stats.reset()
    rollouts: list[Rollout] = []
    started = time.perf_counter()
    for wave in range(waves):
        rollouts += asyncio.run(run_wave(engine, world, concurrency, wave * concurrency, args))
    seconds = time.perf_counter() - started
    reasons = {r.reason for r in rollouts}
    turns = {int(r.metrics["turns"]) for r in rollouts}
    if reasons != {TerminationReason.MAX_TURNS} or turns != {args.turns}:
        raise RuntimeError(f"rollouts did not end on their turn budget: reasons {reasons}, turns {turns}")
    return Cell(
        mode=mode,
        concurrency=concurrency,
        rollouts=len(rollouts),
        seconds=seconds,
        model_calls=sum(int(r.metrics["turns"]) for r in rollouts),
        sampled_tokens=sum(int(r.metrics["completion_tokens"]) for r in rollouts),
        mean_batch=engine.stats.mean_batch,
        max_batch=engine.stats.max_batch,
        prefill_tokens=engine.stats.prefill_tokens,
        shared_prefix_tokens=engine.stats.shared_prefix_tokens,
        prefill_seconds=engine.stats.prefill_seconds,
        decode_seconds=engine.stats.decode_seconds,
    )


def table(cells: list[Cell], concurrencies: list[int]) -> str:
    """Batched against serial at each concurrency, as a Markdown table."""
    by_key = {(c.mode, c.concurrency): c for c in cells}
    lines = [
        "| concurrent rollouts | batched rollouts/s | serial rollouts/s | speed-up | batched tokens/s | serial tokens/s | mean batch |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in concurrencies:
        b, s = by_key[("batched", n)], by_key[("serial", n)]
        lines.append(f"| {n} | {b.rollouts_per_s:.2f} | {s.rollouts_per_s:.2f} | {b.rollouts_per_s / s.rollouts_per_s:.1f}x "
                     f"| {b.tokens_per_s:.0f} | {s.tokens_per_s:.0f} | {b.mean_batch:.1f} |")
    return "\n".join(lines)


def main() -> None:
    """Parse the options, measure both set-ups at every concurrency, print the table, write ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--vocab", choices=("tiny", "qwen"), default="tiny",
                        help="tiny: the 1.5k BPE of rllm.offline.tiny_models; qwen: Qwen's real tokenizer (151,669 ids)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--concurrency", default="1,8,32,64", help="comma-separated rollout counts started together")
    parser.add_argument("--turns", type=int, default=3, help="model calls per rollout")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens sampled per model call (at most)")
    parser.add_argument("--min-rollouts", type=int, default=8, help="rollouts per measurement (in waves of N)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)  # an import configured the root logger
    logger.setLevel(logging.INFO)
    if args.threads:
        torch.set_num_threads(args.threads)
    concurrencies = [int(n) for n in args.concurrency.split(",")]

    tokenizer, model = build_model(args.vocab, args.hidden, args.layers, args.device, DTYPES[args.dtype])
    world = LookupWorld(seed=0)
    engines = {mode: LookupCallingEngine(model, tokenizer, max_batch_size=size) for mode, size in MODES.items()}
    device_name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else platform.processor() or "cpu"
    logger.info("model: Qwen3 hidden %d, %d layers, vocab %s (%d ids), %s on %s (%s), %d torch threads",
                args.hidden, args.layers, args.vocab, len(tokenizer), args.dtype, model.device, device_name,
                torch.get_num_threads())
    asyncio.run(run_wave(engines["batched"], world, 2, 10_000, args))  # warm-up, not measured

    cells = []
    for n in concurrencies:
        for mode, engine in engines.items():
            cell = measure(engine, world, mode, n, args)
            cells.append(cell)
            logger.info("%-7s N=%-3d %3d rollouts %4d calls %6d tokens in %6.2fs: %6.2f rollouts/s %7.0f tokens/s, "
                        "mean batch %.1f; engine: prefill %d tokens (%d shared) %.2fs, decode %.2fs", mode, n, cell.rollouts, cell.model_calls,
                        cell.sampled_tokens, cell.seconds, cell.rollouts_per_s, cell.tokens_per_s, cell.mean_batch,
                        cell.prefill_tokens, cell.shared_prefix_tokens, cell.prefill_seconds, cell.decode_seconds)
    print(table(cells, concurrencies))
    if args.out:
        result = {
            "config": {**vars(args), "device_name": device_name, "torch_threads": torch.get_num_threads(),
                       "vocab_size": len(tokenizer), "torch": torch.__version__},
            "cells": [c.as_dict() for c in cells],
            "speedup": {str(n): next(c for c in cells if c.mode == "batched" and c.concurrency == n).rollouts_per_s
                        / next(c for c in cells if c.mode == "serial" and c.concurrency == n).rollouts_per_s
                        for n in concurrencies},
        }
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
