"""Training: verl's own trainer for real runs (``rllm.training.verl``), RLOO on one machine (``rllm.training.local``).

``verl/`` holds the verl agent loop that runs Strands agents (``StrandsAgentLoop``), its manager,
the reward adapter, the launcher and the shipped recipes (``verl/config/``). ``local/`` holds the
one-machine RLOO trainer with verl's own math and the learning proof. Both take their rollouts from
the Strands runner's ``run_rollout``; the verl rows they train on are written by
``rllm.data.verl_rows``.
"""
