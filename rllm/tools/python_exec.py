"""A Python execution tool: run a snippet in a fresh subprocess, sandboxed, inside the task's work dir.

Each call starts ``python -I`` (isolated mode: no ``PYTHON*`` variables, no user site, the
script's directory not on ``sys.path``) with a minimal environment (``PATH``, ``HOME`` and
``TMPDIR`` set to the work dir, one BLAS thread), in its own process group, with its working
directory set to the work dir. ``sandbox`` picks the isolation:

* ``"bwrap"`` (default): the process runs inside a bubblewrap sandbox (``_bwrap.py``): new user,
  PID, network, IPC and UTS namespaces, no capabilities, uid ``nobody``; the only files it can see
  are ``/usr``, the Python installation and a few ``/etc`` files (all read-only), a fresh
  ``/proc``, ``/dev`` and ``/tmp``, and the work dir, its only writable path. No network unless
  ``allow_network``. When bwrap is missing or cannot create namespaces here, the call raises
  ``SandboxUnavailableError`` naming what to install (a ``ConfigurationError``: inside an agent
  it stops the run, since every rollout would hit it).
* ``"auto"``: bwrap where it works, otherwise the guard alone, with a warning (an explicit opt-in
  to running without an OS sandbox).
* ``"guard"``: the audit-hook guard alone (``_sandbox_guard.py``), an explicit opt-in: a guard
  rail against mistakes and obvious escapes, not a security boundary (native code reached
  through ``ctypes`` function pointers, or C extensions, are not seen by audit hooks).

In every mode the guard runs as a second layer (it refuses paths outside the work dir, starting
processes, ``ctypes`` library and symbol loading, network use unless ``allow_network``, and the
ways to reach and disable it), and the limits hold: a wall-clock limit (the whole process tree is
killed when it expires), CPU-time, address-space and written-file-size rlimits, and capped output.
Not covered: disk space (many files each under the size limit) and, when the sandbox runs as
root without cgroups, the number of processes a guard bypass could start before the time limit.

Calls do not share Python state; files written to the work dir persist between calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any, Literal

from strands import tool

from rllm.errors import SandboxUnavailableError
from rllm.tools._bwrap import INSTALL_HINT, bwrap_argv, bwrap_problem, find_bwrap

__all__ = ["SANDBOX_MODES", "SandboxMode", "describe_isolation", "make_python_exec_tool", "resolve_sandbox",
           "run_python", "sandbox_problem"]

logger = logging.getLogger(__name__)

SandboxMode = Literal["bwrap", "auto", "guard"]
SANDBOX_MODES: tuple[str, ...] = ("bwrap", "auto", "guard")
_GUARD = Path(__file__).with_name("_sandbox_guard.py")
_SYSTEM_READ_PATHS = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero", "/etc/localtime",
                      "/etc/mime.types", "/etc/ssl", "/usr/share/zoneinfo", "/proc/self", "/proc/cpuinfo",
                      "/proc/meminfo", "/sys/devices/system/cpu")


def _python_install_paths() -> list[str]:
    """The interpreter's prefixes, stdlib and site-packages (and the real directory of the executable)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    roots.update(p for p in sysconfig.get_paths().values() if p)
    with contextlib.suppress(AttributeError):
        roots.update(site.getsitepackages())
    return sorted(r for r in roots if os.path.exists(r))


def _python_read_roots() -> list[str]:
    """Paths the guard lets the child read: the Python installation and a few system files."""
    return _python_install_paths() + [p for p in _SYSTEM_READ_PATHS if os.path.exists(p)]


def sandbox_problem() -> str | None:
    """Why no bwrap sandbox can be had here (``None`` when it works); probed once per process."""
    return bwrap_problem(tuple(_python_install_paths()))


def resolve_sandbox(mode: str = "bwrap") -> Literal["bwrap", "guard"]:
    """The isolation a ``python_exec`` call with ``sandbox=mode`` gets on this machine.

    Raises ``SandboxUnavailableError`` for ``"bwrap"`` when bwrap does not work here, and
    ``ValueError`` for an unknown mode.
    """
    if mode not in SANDBOX_MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; use one of {', '.join(SANDBOX_MODES)}")
    if mode == "guard":
        return "guard"
    problem = sandbox_problem()
    if problem is None:
        return "bwrap"
    if mode == "auto":
        _warn_guard_only(problem)
        return "guard"
    raise SandboxUnavailableError(
        f"python_exec needs an OS sandbox and none works here: {problem}. To fix it, {INSTALL_HINT}; "
        "or opt in to the audit-hook guard alone (not a security boundary) with sandbox=\"guard\" "
        "(the GAIA eval: --unsafe-python-exec)")


@functools.lru_cache(maxsize=1)
def _warn_guard_only(problem: str) -> None:
    logger.warning("python_exec runs with the audit-hook guard only, not a security boundary (%s); %s",
                   problem, INSTALL_HINT)


def describe_isolation(mode: str = "bwrap") -> str:
    """One line saying how ``python_exec`` code is isolated in ``mode`` here (raises like ``resolve_sandbox``)."""
    if resolve_sandbox(mode) == "bwrap":
        return (f"bubblewrap sandbox ({find_bwrap()}: user/PID/network namespaces, read-only system, "
                "work dir the only writable path) + audit-hook guard")
    return "audit-hook guard only (UNSAFE: not a security boundary; no OS sandbox)"


def _minimal_env(work_dir: Path) -> dict[str, str]:
    threads = "1"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work_dir),
        "TMPDIR": str(work_dir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """Read a stream to its end, keeping the first ``cap`` bytes; returns (kept, total size)."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < cap:
            kept.extend(chunk[: cap - len(kept)])
    return bytes(kept), total


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _is_signal(number: int) -> bool:
    return number in {int(s) for s in signal.Signals}


def _show(name: str, data: bytes, total: int) -> str:
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    if total > len(data):
        text += f"\n[{name} truncated: {total - len(data):,} more bytes]"
    return text


async def run_python(
    code: str,
    work_dir: Path,
    *,
    timeout: float = 30.0,
    memory_bytes: int | None = 4 * 1024**3,
    file_size_bytes: int | None = 256 * 1024**2,
    max_output_bytes: int = 20_000,
    allow_network: bool = False,
    sandbox: SandboxMode = "bwrap",
) -> str:
    """Run ``code`` as described in the module docstring and report exit status and output.

    Raises ``SandboxUnavailableError`` when ``sandbox="bwrap"`` and bwrap does not work here.
    """
    isolation = await asyncio.to_thread(resolve_sandbox, sandbox)
    work_dir = Path(os.path.realpath(work_dir))
    work_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "work_dir": str(work_dir),
        "read_roots": _python_read_roots(),
        "allow_network": allow_network,
        "cpu_seconds": max(1, int(timeout) + 1),
        "memory_bytes": memory_bytes,
        "file_size_bytes": file_size_bytes,
    }
    command = [sys.executable, "-I", "-X", "utf8", str(_GUARD), json.dumps(config)]
    if isolation == "bwrap":
        bwrap = find_bwrap()
        if bwrap is None:  # removed since the probe
            raise SandboxUnavailableError(f"bwrap is no longer on PATH; {INSTALL_HINT}")
        read_only = [*_python_install_paths(), str(_GUARD)]
        command = bwrap_argv(bwrap, work_dir=str(work_dir), read_only=read_only,
                             allow_network=allow_network) + command
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(work_dir), env=_minimal_env(work_dir), start_new_session=True,
    )
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    assert stdin is not None and stdout is not None and stderr is not None

    async def communicate() -> tuple[tuple[bytes, int], tuple[bytes, int]]:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(code.encode("utf-8"))
            await stdin.drain()
            stdin.close()
        out, err = await asyncio.gather(_read_capped(stdout, max_output_bytes),
                                        _read_capped(stderr, max_output_bytes))
        await process.wait()
        return out, err

    reader = asyncio.ensure_future(communicate())
    try:
        (out, out_total), (err, err_total) = await asyncio.wait_for(asyncio.shield(reader), timeout)
    except asyncio.TimeoutError:
        _kill_group(process)
        try:
            (out, out_total), (err, err_total) = await asyncio.wait_for(reader, 5.0)
        except asyncio.TimeoutError:  # a pipe held open by a process outside the group
            out, out_total, err, err_total = b"", 0, b"", 0
        parts = [f"Error: the code ran longer than the {timeout:g} s time limit and was stopped."]
    except asyncio.CancelledError:
        _kill_group(process)
        reader.cancel()
        raise
    else:
        status = process.returncode
        if status is not None and isolation == "bwrap" and status > 128 and _is_signal(status - 128):
            status = 128 - status  # bwrap reports a child killed by signal N as exit 128 + N
        if status is not None and status < 0:
            parts = [f"Error: the process was killed by signal {_signal_name(-status)} "
                     "(CPU time, memory or file-size limit)."]
        else:
            parts = [f"exit code {status}"]
    if out_total:
        parts.append(f"--- stdout ---\n{_show('stdout', out, out_total)}")
    if err_total:
        parts.append(f"--- stderr ---\n{_show('stderr', err, err_total)}")
    if not out_total and not err_total:
        parts.append("(no output; use print() to show values)")
    return "\n".join(parts)


def make_python_exec_tool(work_dir: Path, *, timeout: float = 30.0, **limits: Any) -> Any:
    """A ``python_exec`` Strands tool bound to ``work_dir``; ``limits`` (``sandbox`` too) go to ``run_python``.

    The sandbox is resolved at each call, so where bwrap cannot run the agent gets the
    ``SandboxUnavailableError`` as the tool's error result; check with ``resolve_sandbox`` first
    to fail before a run instead.
    """
    network = ("It may use the network." if limits.get("allow_network")
               else "There is no network access (use http_request).")
    description = (
        "Run Python 3 code in a fresh process in the task's work directory and return its printed output. "
        "The attachment and any files you write are in the current directory. Each call starts from scratch "
        f"(no variables carry over; files do) and is stopped after {timeout:g} seconds. {network} Files outside "
        "the work directory cannot be accessed and no other programs can be started. Print the values you need."
    )

    @tool(name="python_exec", description=description)
    async def python_exec(code: str) -> str:
        """Run Python code in the task's work directory.

        Args:
            code: A complete Python program.
        """
        return await run_python(code, work_dir, timeout=timeout, **limits)

    return python_exec
