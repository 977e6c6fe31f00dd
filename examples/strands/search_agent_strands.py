"""Evaluate the Strands HotpotQA search agent: exact match, F1, pass@k, turns, termination reasons.

    python examples/strands/search_agent_strands.py --scripted --n 20
    python examples/strands/search_agent_strands.py --base-url http://127.0.0.1:30000/v1 --model Qwen/Qwen3-4B --rollouts 4

The evaluation lives in ``rllm.eval.search``; ``--help`` lists the options.
"""

import sys

from rllm.eval.search import main

if __name__ == "__main__":
    sys.exit(main())
