"""Fixtures of the verl tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rllm.offline.tiny_models import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tiny BPE tokenizer with the Qwen3-style template."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def fault_run_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and lookup rows the real verl runs of a module train (``fixtures.verl_fault_runs``)."""
    from fixtures.verl_fault_runs import prepare

    return prepare(tmp_path_factory.mktemp("faults"))
