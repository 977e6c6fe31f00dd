"""Evaluate a Strands agent on GAIA with GAIA's own scoring rules (accuracy per level, chart, submission).

    python examples/strands/eval_gaia.py --data-dir data/gaia --base-url http://127.0.0.1:30000/v1 --model Qwen/Qwen3-8B
    python examples/strands/eval_gaia.py --scripted --out runs/gaia-demo     # offline, scripted model

The agent lives in ``rllm.agents.gaia``, the evaluation in ``rllm.eval.gaia``.
"""

import sys

from rllm.eval.gaia import main

if __name__ == "__main__":
    sys.exit(main())
