"""Fixtures of the verl tests."""

from __future__ import annotations

from typing import Any

import pytest

from rllm.testing.tiny_models import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tiny BPE tokenizer with the Qwen3-style template."""
    return build_tiny_tokenizer()
