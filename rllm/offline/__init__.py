"""The offline kit: scripted servers and policies, real Qwen tokenizers, tiny models.

What runs with no model hub (the quickstart's fallback, the scripted demos, the learning proof) and what
tests use too; the ``offline`` extra installs what it needs.
"""
