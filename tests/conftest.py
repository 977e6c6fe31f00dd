"""Shared fixtures (scripted OpenAI-compatible servers on 127.0.0.1), the order the slow modules run in, and the test
summary's note on what was skipped."""

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
# No Ray workers started ahead of need: a verl run's first driver had Ray start two that no actor ever used, each
# importing Ray (about 5 of a run's 150-170 CPU-seconds on the 2-core machine). Every Ray cluster a test starts
# reads these from the environment it inherits.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_enable_worker_prestart", "0")

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


def _verl_runs(item: pytest.Item) -> int:
    """The real verl runs a module starts, as its ``slow`` marker says (``pytest.mark.slow(verl_runs=4)``)."""
    marker = item.get_closest_marker("slow")
    return int(marker.kwargs.get("verl_runs", 0)) if marker is not None else 0


_VERL_TESTS = os.path.join("tests", "rllm", "training", "verl", "")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with the most real verl runs first, then the other ``slow`` modules, then the rest.

    Under ``pytest -n N --dist loadfile --no-loadscope-reorder`` (the README's test command) each module runs on
    one worker, sharing its module-scoped fixtures, in this order (xdist would otherwise put the modules with the
    most tests first): the longest start first, each on a worker of its own (``pytest_xdist_make_scheduler``),
    and the short ones fill the other workers and the end.
    """
    for item in items:  # the contributors' fast tier is ``-m "not slow and not verl"`` (docs/install.md)
        if _verl_runs(item) or _VERL_TESTS in str(item.path):
            item.add_marker(pytest.mark.verl)
    items.sort(key=lambda item: (-_verl_runs(item), item.get_closest_marker("slow") is None))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` that gives a worker its next module only once it waits for one.

    xdist's own gives a worker the next module while two of its tests are still to run, so a worker that has
    just started a module of two verl runs is handed a second one at once and runs four while another worker
    finishes early. A worker runs a test only once it knows the next (its teardown depends on it), so it waits
    on its last test until more arrive: this scheduler sends the next module then, one test ahead.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _OneModuleAhead(LoadFileScheduling):  # type: ignore[misc]
        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return _OneModuleAhead(config, log)


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
