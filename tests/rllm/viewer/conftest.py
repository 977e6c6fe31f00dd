"""The run directory and evaluation the viewer's tests serve (``fixtures.viewer_data``), built once per session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fixtures.viewer_data import evaluation_file, run_folder


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with two recorded steps, ``metrics.jsonl`` and an evaluation's ``episodes.jsonl``."""
    from rllm.offline.tiny_models import build_tiny_tokenizer

    folder = tmp_path_factory.mktemp("run")
    asyncio.run(run_folder(folder, build_tiny_tokenizer()))
    asyncio.run(evaluation_file(folder / "episodes.jsonl"))
    return folder
