"""python_exec's sandbox policy: refusing without an OS sandbox unless opted in, and the guard's own shape."""

from __future__ import annotations

import dis
import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any

import pytest

from rllm import errors
from rllm.engine.rollout import OpenAIEngine
from rllm.errors import SandboxUnavailableError
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall
from rllm.tools import describe_isolation, gaia_tools, resolve_sandbox, run_python
from rllm.tools.python_exec import sandbox_problem
from rllm.types import TerminationReason

_NO_BWRAP = sandbox_problem()
needs_bwrap = pytest.mark.skipif(_NO_BWRAP is not None, reason=f"no bubblewrap sandbox on this machine: {_NO_BWRAP}")


@pytest.fixture
def broken_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``bwrap`` on PATH that fails the way it does where user namespaces are disabled."""
    fake = tmp_path / "bin"
    fake.mkdir()
    message = "bwrap: No permissions to create new namespace, likely because the kernel does not allow it"
    (fake / "bwrap").write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    return message


@pytest.fixture
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


async def test_without_a_working_sandbox_python_exec_refuses_and_names_the_fix(
    tmp_path: Path, broken_bwrap: str
) -> None:
    with pytest.raises(SandboxUnavailableError) as refused:
        await run_python("print(1)", tmp_path / "work")
    message = str(refused.value)
    assert broken_bwrap in message and "apt-get install bubblewrap" in message and 'sandbox="guard"' in message
    assert not (tmp_path / "work").exists()  # nothing ran
    with pytest.raises(SandboxUnavailableError):
        describe_isolation()


async def test_a_missing_bwrap_is_named(tmp_path: Path, no_bwrap: None) -> None:
    with pytest.raises(SandboxUnavailableError, match="bwrap \\(bubblewrap\\) is not installed"):
        await run_python("print(1)", tmp_path)


async def test_opting_in_runs_under_the_guard_alone(
    tmp_path: Path, broken_bwrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert await run_python("print(6 * 7)", tmp_path, sandbox="guard") == "exit code 0\n--- stdout ---\n42"
    with caplog.at_level(logging.WARNING, logger="rllm.tools.python_exec"):
        assert await run_python("print(6 * 7)", tmp_path, sandbox="auto") == "exit code 0\n--- stdout ---\n42"
    assert describe_isolation("auto").startswith("audit-hook guard only (UNSAFE")
    assert resolve_sandbox("guard") == "guard"


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown sandbox mode 'docker'"):
        resolve_sandbox("docker")


async def test_the_tool_set_passes_the_mode_on(tmp_path: Path, broken_bwrap: str) -> None:
    python_exec = gaia_tools(tmp_path, include_http=False)[-1]
    with pytest.raises(SandboxUnavailableError):
        await python_exec(code="print(1)")
    guarded = gaia_tools(tmp_path, include_http=False, python_sandbox="guard")[-1]
    assert await guarded(code="print(1)") == "exit code 0\n--- stdout ---\n1"


async def test_an_agent_whose_sandbox_cannot_run_stops_the_run(tmp_path: Path, broken_bwrap: str, serve) -> None:
    """Every rollout would hit it: a configuration error, raised after its tool round, not the policy's mistake."""

    def script(body: dict) -> ScriptedReply:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return ScriptedReply(tool_calls=[ScriptedToolCall("python_exec", json.dumps({"code": "print(1)"}))])
        return ScriptedReply(content="done")

    server = serve(script)
    agent = StrandsAgent(RLLMModel(OpenAIEngine(model="scripted", base_url=server.base_url, max_retries=0)),
                         tools=gaia_tools(tmp_path, include_http=False))
    with pytest.raises(errors.ConfigurationError, match="apt-get install bubblewrap") as stopped:
        await agent.invoke_async("Compute it.")
    assert isinstance(stopped.value, SandboxUnavailableError)
    assert agent.termination_reason is TerminationReason.ERROR and len(server.requests) == 1
    assert isinstance(stopped.value, RuntimeError)  # what it derived from before


@needs_bwrap
def test_auto_and_bwrap_use_the_sandbox_where_it_works() -> None:
    assert resolve_sandbox("bwrap") == resolve_sandbox("auto") == "bwrap"
    assert describe_isolation().startswith("bubblewrap sandbox")


@needs_bwrap
async def test_inside_the_sandbox_only_the_work_dir_exists(tmp_path: Path) -> None:
    work = tmp_path / "work"
    code = ("import os\nstatus = open('/proc/self/status').read()\n"
            "print(os.getuid(), os.getpid() <= 3, status.count('CapEff:\\t0000000000000000'))\n"
            "print(os.path.exists(os.path.dirname(os.getcwd()) + '/other'), os.path.exists('/etc/passwd'),\n"
            "      os.path.exists('/home'))")
    (tmp_path / "other").mkdir()
    result = await run_python(code, work, sandbox="bwrap")
    assert result == "exit code 0\n--- stdout ---\n65534 True 1\nFalse False False"


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "guard"])
async def test_a_death_by_signal_is_reported_as_such(tmp_path: Path, mode: str) -> None:
    result = await run_python("import signal\nsignal.raise_signal(signal.SIGSEGV)", tmp_path, sandbox=mode)
    assert result.startswith("Error: the process was killed by signal SIGSEGV")


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "guard"])
async def test_scientific_libraries_work_in_every_mode(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("pandas")
    (tmp_path / "d.csv").write_text("a,b\n1,2\n3,4\n")
    code = "import numpy as np, pandas as pd\nprint(int(np.asarray(pd.read_csv('d.csv')).sum()))"
    assert await run_python(code, tmp_path, timeout=60, sandbox=mode) == "exit code 0\n--- stdout ---\n10"


def _code_objects(code: CodeType) -> list[CodeType]:
    nested = [c for c in code.co_consts if isinstance(c, CodeType)]
    return [code] + [inner for c in nested for inner in _code_objects(c)]


def _called_functions(function: Any, seen: set[int] | None = None) -> list[Any]:
    """``function`` and the functions of its own file that its closure holds (``resolve``, ``check``), recursively.

    Functions captured from elsewhere (``os.fsdecode``) are what the guard captured on purpose, not its code.
    """
    seen = set() if seen is None else seen
    if id(function) in seen:
        return []
    seen.add(id(function))
    held = [cell.cell_contents for cell in function.__closure__ or ()
            if isinstance(cell.cell_contents, FunctionType)
            and cell.cell_contents.__code__.co_filename == function.__code__.co_filename]
    return [function] + [inner for f in held for inner in _called_functions(f, seen)]


def test_the_guard_hook_looks_up_no_global_or_builtin_name(tmp_path: Path) -> None:
    """Replacing ``os.path.realpath``, ``builtins.isinstance`` or the guard's module functions cannot change it."""
    path = Path(__file__).resolve().parents[3] / "rllm" / "tools" / "_sandbox_guard.py"
    spec = importlib.util.spec_from_file_location("_sandbox_guard_under_test", path)
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    hook = guard._make_hook(str(tmp_path), [sys.prefix], False)
    called = _called_functions(hook)
    assert {f.__name__ for f in called} >= {"hook", "check", "resolve", "inside"}
    for code in (c for f in called for c in _code_objects(f.__code__)):
        loads = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        assert not loads, f"{code.co_name} looks up {loads} at call time"
    with pytest.raises(PermissionError, match="may not read"):
        hook("open", ("/etc/passwd", "r", 0))
    with pytest.raises(PermissionError, match="accepts only str, bytes or pathlib paths"):
        hook("open", (type("P", (), {"__fspath__": lambda self: "x"})(), "r", 0))
    hook("open", (str(tmp_path / "inside.txt"), "w", 0))
    hook("open", (str(Path(sys.prefix) / "lib"), "r", 0))


def test_an_installation_under_tmp_is_bound_over_the_empty_tmp(tmp_path) -> None:
    """A venv (or a checkout) under /tmp must stay visible: the empty /tmp is mounted before the binds."""
    from rllm.tools._bwrap import bwrap_argv

    venv = tmp_path / "venv"
    venv.mkdir()
    argv = bwrap_argv("bwrap", work_dir=str(tmp_path / "work"), read_only=[str(venv)])
    bind = next(i for i in range(len(argv) - 2) if argv[i : i + 3] == ["--ro-bind", str(venv), str(venv)])
    assert argv.index("--tmpfs") < bind
