"""Deprecated: verl training moved to ``rllm.training.verl`` (rows to ``rllm.data.verl_rows``).

This package keeps the old import paths and ``python -m rllm.integrations.verl.train`` working for
one release; each submodule is the new module itself, so classes named in existing configs
(``rllm.integrations.verl.agent_loop.StrandsAgentLoop``) are the same objects.
"""

import warnings

from rllm.data.verl_rows import AGENT_NAME, verl_row, write_parquet
from rllm.training.verl.reward import compute_score

warnings.warn(
    "rllm.integrations.verl moved to rllm.training.verl (verl rows: rllm.data.verl_rows); "
    "the old path will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["AGENT_NAME", "compute_score", "verl_row", "write_parquet"]
