"""Bubblewrap (``bwrap``) as the OS sandbox of ``python_exec``: finding it, probing it, building its command line.

The sandbox gets new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all``), runs
as ``nobody`` (uid 65534) with no capabilities, in its own session, and dies with its parent. Its
filesystem is an empty tmpfs holding read-only binds of ``/usr`` (and the ``/bin``, ``/lib*``
links or directories), the Python installation and a few ``/etc`` files imports need, a fresh
``/proc`` and ``/dev``, an empty ``/tmp``, and one writable bind: the task's work dir. Everything
else on the machine (home directories, the project, other tasks' work dirs, the parent's
``/proc`` entries) does not exist inside it.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence

logger = logging.getLogger(__name__)

INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`) "
                "on a kernel that allows user namespaces")
_NOBODY = "65534"
_TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/mime.types",
              "/etc/ssl", "/etc/ca-certificates", "/etc/fonts", "/etc/matplotlibrc")
_ETC_NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf")
_PROBE_TIMEOUT_S = 20.0


def find_bwrap() -> str | None:
    """The ``bwrap`` executable on ``PATH``, or ``None``."""
    return shutil.which("bwrap")


def _outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one of them (a bind of the outer one covers them)."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == root or path.startswith(root.rstrip("/") + "/") for root in kept):
            kept.append(path)
    return kept


def bwrap_argv(
    executable: str,
    *,
    work_dir: str,
    read_only: Sequence[str],
    allow_network: bool = False,
) -> list[str]:
    """The ``bwrap ... --`` prefix that runs a command in the sandbox described in the module docstring.

    ``read_only`` are extra host paths bound read-only at the same place (the Python installation);
    ``work_dir`` is bound read-write at the same place and is the working directory.
    """
    argv = [executable, "--unshare-all", "--unshare-user", "--uid", _NOBODY, "--gid", _NOBODY,
            "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if allow_network:
        argv.append("--share-net")
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_LEVEL_LINKS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # The empty /tmp comes before the binds, so a Python installation (a venv, say) or a work dir
    # that lives under /tmp is bound on top of it instead of being hidden by it.
    argv += ["--tmpfs", "/tmp"]
    etc = _ETC_FILES + (_ETC_NETWORK_FILES if allow_network else ())
    host_paths = [p for p in etc if os.path.exists(p)]
    host_paths += [os.path.realpath(p) for p in read_only if os.path.exists(p)]
    for path in _outermost(p for p in host_paths if not p.startswith("/usr/")):
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", work_dir, work_dir, "--chdir", work_dir, "--"]
    return argv


@functools.lru_cache(maxsize=8)
def probe_bwrap(executable: str, python: str, read_only: tuple[str, ...]) -> str | None:
    """Why ``python`` cannot run inside the sandbox (``None`` when it can); cached per process.

    Runs ``python -I -c`` in the exact sandbox ``python_exec`` builds (with a scratch work dir), so
    a kernel without user namespaces, a seccomp or AppArmor policy refusing them, or a missing
    library shows up here instead of in the first tool call.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rllm-bwrap-probe-") as scratch:
        scratch = os.path.realpath(scratch)
        argv = bwrap_argv(executable, work_dir=scratch, read_only=read_only)
        argv += [python, "-I", "-c", "import os; open('probe', 'w').write(str(os.getpid()))"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{executable} could not be run: {error}"
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            return f"{executable} failed (exit {done.returncode}): {detail[-1] if detail else 'no output'}"
        try:
            with open(os.path.join(scratch, "probe")) as handle:
                pid = handle.read()
        except OSError:
            return f"{executable} ran but the sandboxed process could not write to its work dir"
    if pid not in ("1", "2"):  # bwrap's init is PID 1 of the new PID namespace, the command PID 2
        return f"{executable} ran the command outside a new PID namespace (pid {pid})"
    logger.debug("bwrap sandbox works (%s)", executable)
    return None


def bwrap_problem(read_only: Sequence[str]) -> str | None:
    """Why no bwrap sandbox can be had for this interpreter, or ``None`` when it works."""
    executable = find_bwrap()
    if executable is None:
        return "bwrap (bubblewrap) is not installed or not on PATH"
    return probe_bwrap(executable, sys.executable, tuple(read_only))
