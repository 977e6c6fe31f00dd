"""Shared fixtures: scripted OpenAI-compatible servers on 127.0.0.1 and real Strands tools."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from rllm.testing.scripted_server import ScriptedOpenAIServer  # noqa: E402


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start scripted servers for a test and stop them after it: ``srv = serve(script)``."""
    servers: list[ScriptedOpenAIServer] = []

    def _serve(script: Any = None) -> ScriptedOpenAIServer:
        server = ScriptedOpenAIServer(script).start()
        servers.append(server)
        return server

    yield _serve
    for server in servers:
        server.stop()
