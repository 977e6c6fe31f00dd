"""``python -m rllm.viewer PATH``: see ``rllm.viewer.cli``."""

import sys

from rllm.viewer.cli import main

sys.exit(main())
