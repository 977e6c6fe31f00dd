"""verl's RL step against the local trainer's: the same warm-started model, batch and rollouts, side by side.

    python scripts/bench_trainers.py --out runs/bench-trainers            # CPU: the learning proof's settings
    python scripts/bench_trainers.py --device cuda --out runs/bench-gpu
    python scripts/bench_trainers.py --out runs/bench-trainers --profile runs/bench-trainers/profile

Warm-starts the learning proof's model once (rllm.proofs.verl_trainer.prepare_verl_proof), then runs
--steps RLOO steps with LocalRLOOTrainer in this process and --steps steps of verl's own trainer
(python -m rllm.training.verl.train, the lookup_rloo recipe, embedded rollout backend) from the same
saved model, without held-out evaluation. Each step is timed whole: rollouts, log-probs and the
update (verl: timing_s/step; local: rollouts + update). The first step of each is left out of the
medians (verl's warm-up). Prints a table and writes DIR/bench.json; the ratio is verl's median step
over the local trainer's, from this one run. Both trainers start from the warm-started weights with a
fresh AdamW at the RL learning rate, so their policies, and the rollouts each step trains on, move alike
(each row prints its mean response tokens). ``--profile DIR`` also reads, from verl's first step on, the CPU of
each of its Ray processes and py-spy's hottest frames in each (``_bench_trainers_profile.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_trainers_profile import RayProfile, print_profile  # noqa: E402

logger = logging.getLogger("bench_trainers")

VERL_TIMINGS = {"step": "timing_s/step", "rollouts": "timing_s/rllm_rollouts", "old_log_prob": "timing_s/old_log_prob",
                "update": "timing_s/update_actor", "weight_sync": "timing_s/update_weights"}


def _median(rows: list[dict[str, float]], key: str) -> float:
    values = [row[key] for row in rows[1:] if key in row] or [row[key] for row in rows if key in row]
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Run both trainers and print the comparison; 0 when both ran their steps."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5, help="RL steps of each trainer (the first is not counted)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verl-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override of the lookup_rloo recipe (repeatable), e.g. to time one setting")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="from verl's step 1 on: each Ray process's CPU seconds and py-spy's top frames, into DIR")
    args = parser.parse_args(argv)
    # After the command line: --help needs neither torch nor verl (seconds each).
    from rllm.proofs.local_trainer import ProofConfig
    from rllm.proofs.verl_trainer import prepare_verl_proof, run_verl_trainer, verl_overrides
    from rllm.training.local.rloo import LocalRLOOTrainer, default_actor_config
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("strands").setLevel(logging.ERROR)
    config = ProofConfig.for_device(args.device, seed=args.seed, rl_steps=args.steps)

    proof, _, warm_seconds = prepare_verl_proof(config, args.out)
    # A fresh AdamW at the RL learning rate, as verl's actor starts (the learning proof keeps the warm start's
    # moments): both policies then move alike, and so do the lengths of the rollouts each step trains on.
    proof.trainer = LocalRLOOTrainer(proof.model, default_actor_config(config.prompts_per_step,
                                                                       config.rollouts_per_prompt,
                                                                       config.micro_batch_size),
                                     lr=config.rl_lr, temperature=config.temperature)
    local = []
    for step in range(1, args.steps + 1):
        row = proof.rl_step(step)
        local.append({"step": row["step_seconds"], "rollouts": row["rollout_seconds"],
                      "update": row["update_seconds"], "response_tokens": row["response_tokens"]})
        logger.info("local step %d: %s", step, local[-1])
    del proof
    gc.collect()

    verl: list[dict[str, float]] = []
    profile = RayProfile(args.profile) if args.profile else None

    def on_line(line: dict[str, Any]) -> None:
        data = line["data"]
        if line["step"] > 0:
            if profile is not None:
                profile.start()  # once, at step 1's line; every later line reads the CPU again
                profile.sample_cpu()
            verl.append({name: float(data[key]) for name, key in VERL_TIMINGS.items() if key in data}
                        | {"response_tokens": float(data.get("response_length/mean", float("nan")))})
            logger.info("verl step %d: %s", line["step"], verl[-1])

    overrides = [*verl_overrides(config, args.out / "warm_start_model", args.out / "data", args.out),
                 "trainer.val_before_train=false", "trainer.test_freq=-1", *args.verl_override]
    returncode = run_verl_trainer(overrides, cpu=args.device == "cpu", metrics_path=args.out / "verl_metrics.jsonl",
                                  log_path=args.out / "verl.log", on_line=on_line)
    profiled = profile.finish() if profile is not None else None
    if returncode != 0 or len(verl) < args.steps:
        logger.error("verl's trainer exited with %d after %d of %d steps (see %s)", returncode, len(verl),
                     args.steps, args.out / "verl.log")
        return 1
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "device": args.device,
        "config": {"prompts_per_step": config.prompts_per_step, "rollouts_per_prompt": config.rollouts_per_prompt,
                   "hidden_size": config.hidden_size, "num_layers": config.num_layers, "vocab": config.vocab,
                   "max_tokens": config.max_tokens, "response_length": config.response_length},
        "warm_start_seconds": round(warm_seconds, 1),
        "local": local,
        "verl": verl,
        "local_median_step": _median(local, "step"),
        "verl_median_step": _median(verl, "step"),
        "profile": profiled,
    }
    result["ratio"] = result["verl_median_step"] / result["local_median_step"]
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nmedian RL step over steps 2-{args.steps} ({config.prompts_per_step} prompts x "
          f"{config.rollouts_per_prompt} rollouts, {args.device}):")
    print(f"  local trainer  {result['local_median_step']:6.1f} s  (rollouts {_median(local, 'rollouts'):.1f} s, "
          f"update {_median(local, 'update'):.1f} s; {_median(local, 'response_tokens'):.0f} response tokens "
          "per rollout)")
    print(f"  verl's trainer {result['verl_median_step']:6.1f} s  (rollouts {_median(verl, 'rollouts'):.1f} s, "
          f"update {_median(verl, 'update'):.1f} s, log-prob audit {_median(verl, 'old_log_prob'):.1f} s, "
          f"weight sync {_median(verl, 'weight_sync'):.1f} s; {_median(verl, 'response_tokens'):.0f} response "
          "tokens per rollout)")
    print(f"  verl / local   {result['ratio']:6.2f}x")
    if profiled is not None:
        print_profile(profiled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
