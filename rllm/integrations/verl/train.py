"""Deprecated alias of ``rllm.training.verl.train``: importing it gives that module; ``python -m`` runs its ``main``."""

import importlib
import logging
import sys

_train = importlib.import_module("rllm.training.verl.train")

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    _train.main()
else:
    sys.modules[__name__] = _train
