"""Deprecated alias of ``rllm.training.verl.reward``: importing it gives that module itself."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("rllm.training.verl.reward")
