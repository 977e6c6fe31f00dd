"""Deprecated alias of ``rllm.training.verl.agent_loop``: importing it gives that module itself."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("rllm.training.verl.agent_loop")
