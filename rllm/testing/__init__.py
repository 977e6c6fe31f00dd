"""Offline stand-ins for tests and demos: scripted servers and policies, real Qwen tokenizers, tiny models."""
