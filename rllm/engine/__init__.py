"""Rollout engines: the models behind agents, OpenAI-compatible or token-in/token-out (``rllm.engine.rollout``)."""
