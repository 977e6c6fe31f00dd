"""The main job: the Strands HotpotQA search agent end to end (run it with ``bash scripts/quickstart.sh``).

The pipeline lives in ``rllm.eval.search_quickstart``; ``--help`` lists the options.
"""

import sys

from rllm.eval.search_quickstart import main

if __name__ == "__main__":
    sys.exit(main())
