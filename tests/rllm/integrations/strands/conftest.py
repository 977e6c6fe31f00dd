"""Fixtures of the Strands integration tests."""

from __future__ import annotations

from typing import Any

import pytest

from rllm.offline.chat_templates import FAMILIES


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """Qwen's real tokenizer with Qwen3's shipped chat template (built offline)."""
    return FAMILIES["qwen3"].tokenizer()
