"""verl training: a native verl agent loop for Strands agents, its manager, the score it hands verl and the launcher.

Import ``rllm.training.verl.agent_loop`` for ``StrandsAgentLoop`` (it imports verl); the reward
module works without verl installed. The recipes are package data in ``config/``; the rows they
train on come from ``rllm.data.verl_rows``.
"""
