"""Prove that training works: a Strands tool agent's held-out reward rises under RLOO, on one machine.

    python scripts/learning_proof.py --device cpu --out runs/proof-cpu      # 2-core CPU, Qwen's first 8k ranks
    python scripts/learning_proof.py --device cuda --out runs/proof-gpu     # GPU: Qwen's real tokenizer
    python scripts/learning_proof.py --trainer verl --device cpu --out runs/proof-cpu-verl   # RL by verl's trainer

Writes DIR/metrics.jsonl (one line per step), DIR/summary.json and DIR/learning_curve.png, and exits
1 when the proof fails (see rllm.proofs.local_trainer for what it checks). --trainer verl runs the
same warm start, then RLOO and held-out validation through verl's own trainer with the embedded
rollout backend (rllm.proofs.verl_trainer); it also writes DIR/warm_start_model/, DIR/data/,
DIR/verl_metrics.jsonl (verl's file logger) and DIR/verl.log (verl's console).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rllm.offline.qwen_tokenizer import VOCABS

TRAINERS = ("local", "verl")

logger = logging.getLogger("learning_proof")


def main(argv: list[str] | None = None) -> int:
    """Run the proof with the command line's configuration; 0 when it passed, 1 when it failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=TRAINERS, default="local",
                        help="local: LocalRLOOTrainer in this process (default); verl: verl's own trainer, "
                             "the embedded rollout backend and verl's validation (--cpu on a CPU)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics.jsonl, summary.json, the PNG")
    parser.add_argument("--vocab", choices=sorted(VOCABS), default=None,
                        help="qwen: Qwen's real tokenizer (default on CUDA); qwen-8k: its first 8,192 ranks (CPU)")
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--warm-steps", type=int, default=None)
    parser.add_argument("--warm-lr", type=float, default=None)
    parser.add_argument("--warm-batch", type=int, default=None)
    parser.add_argument("--demonstration-mix", type=lambda v: tuple(float(x) for x in v.split(",")), default=None,
                        help="shares of demonstrations doing two hops, one hop, no tool (default 0.35,0.4,0.25)")
    parser.add_argument("--rl-steps", type=int, default=None)
    parser.add_argument("--rl-lr", type=float, default=None)
    parser.add_argument("--prompts-per-step", type=int, default=None)
    parser.add_argument("--rollouts-per-prompt", type=int, default=None)
    parser.add_argument("--world-size", type=int, default=None, help="boxes in the lookup world (default 1000)")
    parser.add_argument("--held-out", type=int, default=None, help="boxes held out for evaluation (default 64)")
    parser.add_argument("--demonstrations", type=int, default=None, help="warm-start demonstrations (default 512)")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="RL steps between held-out evaluations (default 5)")
    parser.add_argument("--eval-samples", type=int, default=None, help="samples per held-out box (default 2)")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--response-length", type=int, default=None, help="tokens after the prompt (default 320)")
    parser.add_argument("--verl-override", action="append", default=[], metavar="KEY=VALUE",
                        help="with --trainer verl: a Hydra override of the lookup_rloo recipe (repeatable)")
    args = parser.parse_args(argv)
    # After the command line: --help and a mistyped flag need neither torch nor the trainers (seconds each).
    from rllm.proofs.local_trainer import LearningProof, ProofConfig
    from rllm.training.curves import plot_learning_curve
    if args.verl_override and args.trainer != "verl":
        parser.error("--verl-override needs --trainer verl")
    # force: an import (verl) has already configured the root logger, which would drop our INFO lines
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    # Strands warns on every malformed tool call a policy writes; the metrics count them instead.
    logging.getLogger("strands").setLevel(logging.ERROR)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    config = ProofConfig.for_device(
        args.device, seed=args.seed, vocab=args.vocab, hidden_size=args.hidden_size, num_layers=args.num_layers,
        warm_steps=args.warm_steps, warm_lr=args.warm_lr, warm_batch=args.warm_batch,
        demonstration_mix=args.demonstration_mix, rl_steps=args.rl_steps, rl_lr=args.rl_lr,
        prompts_per_step=args.prompts_per_step,
        rollouts_per_prompt=args.rollouts_per_prompt, world_size=args.world_size, held_out=args.held_out,
        demonstrations=args.demonstrations, eval_every=args.eval_every, eval_samples=args.eval_samples,
        micro_batch_size=args.micro_batch_size, response_length=args.response_length,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=config.rl_steps, desc="RLOO", unit="step", dynamic_ncols=True)
    last_eval: list[float] = []

    def on_step(row: dict) -> None:
        if "eval_reward" in row:
            last_eval.append(row["eval_reward"])
        if row["step"] > 0:
            bar.update(1)
        bar.set_postfix(reward=f"{row.get('train_reward', float('nan')):.2f}",
                        held_out=f"{last_eval[-1]:.2f}" if last_eval else "-",
                        lookups=f"{row.get('tool_calls', row.get('eval_tool_calls', 0)):.2f}")

    result: Any
    if args.trainer == "verl":
        from rllm.proofs.verl_trainer import run_verl_proof

        result = run_verl_proof(config, args.out, on_step=on_step, overrides=args.verl_override)
        bar.close()
        logger.info("held-out reward %.3f -> %.3f in %d steps, %.0fs (warm start %.0fs, verl %.0fs); "
                    "first-step log-prob gap %.1e", result.eval_reward_before, result.eval_reward_after, result.steps,
                    result.seconds, result.warm_start_seconds, result.verl_seconds, result.first_logprob_gap_max)
    else:
        result = LearningProof(config, on_step=on_step).run(args.out / "metrics.jsonl")
        bar.close()
        logger.info("held-out reward %.3f -> %.3f in %d steps, %.0fs; first-update ratio deviation %.1e",
                    result.eval_reward_before, result.eval_reward_after, result.steps, result.seconds,
                    result.first_ratio_max_dev)
    summary = result.summary()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if any("eval_reward" in row for row in result.history):
        plot_learning_curve(result.history, args.out / "learning_curve.png",
                            title=f"two-hop lookup, Qwen3 {config.hidden_size}x{config.num_layers}, {config.vocab}, "
                                  f"{config.device}, seed {config.seed}, {args.trainer} trainer")
    if not result.passed:
        for failure in result.failures:
            logger.error("proof failed: %s", failure)
        return 1
    logger.info("proof passed: %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
