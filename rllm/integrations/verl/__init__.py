"""verl adapter: a native verl agent loop for Strands agents, a reward function adapter and verl rows.

Import ``rllm.integrations.verl.agent_loop`` for ``StrandsAgentLoop`` (it imports verl); the
reward and rows modules work without verl installed.
"""

from rllm.integrations.verl.reward import compute_score
from rllm.integrations.verl.rows import AGENT_NAME, verl_row, write_parquet

__all__ = ["AGENT_NAME", "compute_score", "verl_row", "write_parquet"]
