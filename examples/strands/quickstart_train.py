"""The main job: a Strands tool agent learning through verl's own trainer (run it with ``bash scripts/quickstart.sh``).

The pipeline lives in ``rllm.proofs.quickstart``; ``--help`` lists the options.
"""

import sys

from rllm.proofs.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
