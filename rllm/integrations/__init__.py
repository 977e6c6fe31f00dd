"""Adapters between rllm and agent frameworks."""
