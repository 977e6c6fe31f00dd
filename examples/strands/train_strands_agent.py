"""Train the Strands HotpotQA search agent with verl (RLOO, Qwen3-4B, 8 GPUs, fp16); run it through train_strands_agent.sh.

    python examples/strands/train_strands_agent.py [--dry-run] [hydra overrides ...]

The recipe is ``rllm/training/verl/config/strands_hotpotqa_rloo.yaml`` (package data); the launcher
lives in ``rllm.training.verl.train``.
"""

import sys

from rllm.training.verl.train import main

if __name__ == "__main__":
    sys.exit(main())
