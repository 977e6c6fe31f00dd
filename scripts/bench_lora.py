"""LoRA beside full fine-tuning through verl's own trainer on CPU, in one run: the benchmarks table's rows.

    python scripts/bench_lora.py [--steps 3] [--rank 32] [--out runs/bench-lora]

For each model (the "train your own agent" page's tiny Qwen3, 64x2, and the quickstart's, 256x2, random init on
Qwen's first 8k ranks) trains the lookup recipe ``--steps`` RLOO steps of 8 boxes x 8 rollouts twice, every
weight and then a rank-``--rank`` adapter on every linear layer (verl's own keys, nothing else changed), and
prints per run: the trainable and total parameters (``rllm/actor/*``, peft's count for LoRA), the actor
worker's peak resident memory (``rllm/actor/peak_rss_gb``: weights, gradients, Adam state and activations on
CPU) and the median seconds of the actor update and of the whole step after the first. The reward is 0 and 1 in
turn within each box's rollouts (``varied_score``): a random model's groups then have a signal to train on. Exits
non-zero when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from rllm.agents.lookup import LookupWorld
from rllm.offline.chat_templates import load_chat_template
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer
from rllm.offline.tiny_models import build_tiny_qwen3
from rllm.proofs.local_trainer import ProofConfig
from rllm.proofs.quickstart import lora_overrides
from rllm.proofs.verl_trainer import run_verl_trainer, verl_overrides, write_lookup_rows

_SCORED: dict[object, int] = {}


def varied_score(task: dict, final_answer: str) -> float:
    """0 and 1 in turn for the rollouts of each box (``rllm.reward_fn``; the row's id is in its ``extra_info``)."""
    key = (task.get("extra_info") or {}).get("id", task.get("id"))
    turn = _SCORED.get(key, 0)
    _SCORED[key] = turn + 1
    return float(turn % 2)


MODELS = {"page tiny Qwen3 64x2": 64, "quickstart Qwen3 256x2": 256}
"""The models compared, by hidden size (2 layers each)."""


def _run(name: str, model_dir: Path, data_dir: Path, out: Path, config: ProofConfig, extra: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*verl_overrides(config, model_dir, data_dir, out), "trainer.test_freq=-1",
                 "trainer.val_before_train=false", "trainer.save_freq=-1",
                 # A random model writes to the end of every response and calls no tool: what it trains on is the
                 # scripted score above, and the guards that would stop it on those are off.
                 "rllm.reward_fn=bench_lora:varied_score",
                 "rllm.guards.max_truncated_share=null", "rllm.guards.max_steps_without_tool_calls=null",
                 "rllm.guards.max_malformed_tool_call_share=null", *extra]
    started = time.perf_counter()
    code = run_verl_trainer(overrides, cpu=True, metrics_path=out / "verl_metrics.jsonl", log_path=out / "verl.log")
    wall = time.perf_counter() - started
    if code:
        raise SystemExit(f"{name}: verl exited {code}; see {out / 'verl.log'}")
    steps = [row["data"] for row in map(json.loads, (out / "verl_metrics.jsonl").read_text().splitlines())
             if row["step"] > 0]
    later = steps[1:] or steps
    return {"trainable": int(steps[-1]["rllm/actor/trainable_params"]), "params": int(steps[-1]["rllm/actor/params"]),
            "peak_rss_gb": max(s["rllm/actor/peak_rss_gb"] for s in steps),
            "update_s": statistics.median(s["timing_s/update_actor"] for s in later),
            "step_s": statistics.median(s["timing_s/step"] for s in later),
            "served_match": all(s["rllm/weights/fingerprint_match"] == 1.0 for s in steps), "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    """Train each model both ways and print the table; 0 when every run passed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-lora"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                             os.environ.get("PYTHONPATH")]))  # the scorer, in verl
    out: Path = args.out.resolve()
    tokenizer = build_qwen_tokenizer(load_chat_template("qwen3"), QwenVocab.QWEN_FIRST_8K)
    config = ProofConfig.for_device("cpu", rl_steps=args.steps, eval_every=args.steps)
    world = LookupWorld(config.world_size, seed=0)
    write_lookup_rows(*world.split(config.held_out), out / "data")
    rows = []
    for name, hidden in MODELS.items():
        model_dir = out / f"model-{hidden}"
        build_tiny_qwen3(tokenizer, model_dir, seed=0, hidden_size=hidden, num_layers=2)
        for kind, extra in (("full", []), (f"LoRA r{args.rank}", lora_overrides(args.rank))):
            result = _run(f"{name}, {kind}", model_dir, out / "data", out / f"{hidden}-{kind.split()[0]}", config,
                          extra)
            rows.append((name, kind, result))
            print(f"{name:<24} {kind:<9} {result}", flush=True)
    print(f"\n{platform.node()}, {platform.processor() or platform.machine()}, python {platform.python_version()}; "
          f"{args.steps} steps of {config.prompts_per_step} boxes x {config.rollouts_per_prompt} rollouts\n")
    print("| model | training | trainable parameters | actor peak memory | actor update | step | served = actor |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, r in rows:
        share = 100.0 * r["trainable"] / r["params"]
        print(f"| {name} | {kind} | {r['trainable']:,} of {r['params']:,} ({share:.1f}%) | {r['peak_rss_gb']:.2f} GB "
              f"| {r['update_s']:.2f} s | {r['step_s']:.2f} s | {'every step' if r['served_match'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
