"""Shared fixtures (scripted OpenAI-compatible servers on 127.0.0.1) and the test summary's note on what was skipped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")
# One OpenMP thread per process (a caller's own setting wins; set before any test imports torch). The README's
# command runs three xdist workers on the machine's cores and every real verl run adds about nine processes, so
# torch's per-process thread pools only contend: on the 2-core machine the suite's tests took 682 s with one
# thread against 762 s with the default of one per core. The verl CPU mode passes the setting on to its workers.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from rllm.offline.scripted_server import ScriptedOpenAIServer  # noqa: E402


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``slow`` (a real verl trainer, a venv to build) first.

    Under ``pytest -n N --dist loadfile --no-loadscope-reorder`` (the README's test command) each module runs on
    one worker, sharing its module-scoped fixtures, in this order (xdist would otherwise put the modules with the
    most tests first), so the long modules start first and the short ones fill the other workers.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


BWRAP_SKIP_REASON = "no bubblewrap sandbox on this machine"
"""The start of every skip reason of a test that needs bubblewrap (``python_exec``'s OS sandbox)."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the missing system package and how many tests it cost, so a skipped sandbox suite is never silent."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if BWRAP_SKIP_REASON in str(r.longrepr)]
    if not skipped:
        return
    terminalreporter.write_sep("=", "missing system package", yellow=True)
    terminalreporter.write_line(
        f"{len(skipped)} sandbox tests skipped: bubblewrap (bwrap) does not run here; install it "
        "(Debian/Ubuntu: apt-get install bubblewrap) to run python_exec's escape suite", yellow=True)
