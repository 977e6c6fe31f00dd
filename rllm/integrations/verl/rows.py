"""Deprecated alias of ``rllm.data.verl_rows``: importing it gives that module itself."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("rllm.data.verl_rows")
