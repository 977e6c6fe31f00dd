"""Child-side guard for ``python_exec``: run as ``python -I _sandbox_guard.py CONFIG`` with the code on stdin.

It lowers resource limits (CPU seconds, address space, written file size, no core dumps), then
installs a ``sys.addaudithook`` hook before running the code, which refuses:

* opening, creating, renaming, deleting or linking a path that resolves outside the work dir,
  except read-only access to the Python installation and a few system files imports need
  (``/proc/self/mem``, other processes' ``/proc`` entries and the rest of ``/proc/self`` are out);
* listing or changing into a directory outside it;
* starting processes (``subprocess``, ``os.system``, ``exec*``, ``spawn*``, ``fork``, a re-import
  of ``_posixsubprocess``, whose ``fork_exec`` is removed), signalling other processes;
* ``ctypes`` loading a library (``CDLL(None)`` included), looking up a symbol, or making objects
  at raw addresses;
* raising resource limits, tracing or profiling frames, and listing objects through ``gc`` (the
  ways to reach and switch off the hook from Python);
* network connections and DNS lookups, unless the config allows the network.

The hook keeps its state in a closure and calls only functions captured when it was built, so
monkeypatching ``os``, ``os.path``, ``builtins`` or this module does not change what it checks.

This is the second layer under the bubblewrap sandbox, and the only one in ``sandbox="guard"``
mode, where it is a guard rail, not a security boundary: native code reached through ``ctypes``
function pointers or a C extension calling the OS directly is not seen by audit hooks (the escape
tests in ``tests/rllm/tools/test_python_exec_escapes.py`` name the ones that get through).

This file imports only the standard library and must stay self-contained (no ``rllm`` imports).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "pty.spawn", "os.startfile", "signal.pthread_kill",
})
_NETWORK_EVENTS = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
})
_NATIVE_EVENTS = frozenset({
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at",
    "ctypes.call_function",
})
_INTROSPECTION_EVENTS = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
    "sys._settraceallthreads", "sys._setprofileallthreads", "resource.setrlimit", "resource.prlimit",
})
_BLOCKED_IMPORTS = frozenset({"_posixsubprocess"})
_WRITE_PATH_EVENTS = {
    "os.mkdir": (0,), "os.rmdir": (0,), "os.remove": (0,), "os.rename": (0, 1), "os.link": (0, 1),
    "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.lchmod": (0,),
    "os.mkfifo": (0,), "os.mknod": (0,), "os.chdir": (0,),  # chdir only into the work dir
}
_READ_PATH_EVENTS = {"os.listdir": (0,), "os.scandir": (0,), "os.listxattr": (0,), "os.getxattr": (0,)}
_PROC_SELF_FILES = ("status", "stat", "statm", "limits", "cgroup")
_MAX_SYMLINK_HOPS = 40


def _make_resolver():  # noqa: ANN202
    """``os.path.realpath`` rebuilt from ``lstat``/``readlink`` captured now; missing parts kept as written.

    A closure like the hook's: it looks up no global or builtin name when it runs.
    """
    import stat as stat_module

    lstat, readlink, getcwd, is_link = os.lstat, os.readlink, os.getcwd, stat_module.S_ISLNK
    denied, os_error, max_hops = PermissionError, OSError, _MAX_SYMLINK_HOPS

    def resolve(path: str) -> str:
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        pending = path.split("/")[::-1]
        resolved, hops = "", 0
        while pending:
            part = pending.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                resolved = resolved[: resolved.rfind("/")] if resolved else ""
                continue
            candidate = resolved + "/" + part
            try:
                mode = lstat(candidate).st_mode
            except os_error:
                resolved = candidate
                continue
            if not is_link(mode):
                resolved = candidate
                continue
            hops += 1
            if hops > max_hops:
                raise denied(f"python_exec: too many symbolic links in {path!r}")
            target = readlink(candidate)
            if target.startswith("/"):
                resolved = ""
            pending.extend(target.split("/")[::-1])
        return resolved or "/"

    return resolve


def _make_checker(resolve, work_dir: str, read_roots: list[str]):  # noqa: ANN001, ANN202
    """``check(path, write, event)``: refuse a path outside the work dir (reads: outside ``read_roots`` too)."""
    import pathlib

    fsdecode, is_instance, tuple_type, denied, exact_type = os.fsdecode, isinstance, tuple, PermissionError, type
    int_type = int
    plain_path_types = (str, bytes, pathlib.PurePosixPath, pathlib.PosixPath, os.DirEntry)
    root = resolve(work_dir)
    roots = tuple_type(resolve(r) for r in read_roots)

    def inside(path: str, base: str) -> bool:
        return path == base or path.startswith(base.rstrip("/") + "/")

    def check(path: object, write: bool, event: str) -> None:
        if path is None or is_instance(path, int_type):
            return  # an already-open descriptor: it came through a checked open
        if exact_type(path) not in plain_path_types:
            # A custom os.PathLike could answer differently when the OS asks again after this check.
            raise denied(f"python_exec accepts only str, bytes or pathlib paths ({event}), "
                         f"not {exact_type(path).__name__}")
        # Its exact type is one of plain_path_types, checked without isinstance (which the hook may not
        # look up), so mypy cannot see the narrowing.
        name = fsdecode(path)  # type: ignore[arg-type]
        resolved = resolve(name)
        if inside(resolved, root):
            return
        if not write:
            for base in roots:
                if inside(resolved, base):
                    return
        verb = "write to" if write else "read"
        raise denied(f"python_exec may not {verb} {name!r} ({event}): "
                     f"only the work directory {root} is accessible")

    return check


def _make_hook(work_dir: str, read_roots: list[str], allow_network: bool):  # noqa: ANN202, C901
    """The audit hook: a closure over immutable state and over functions captured now.

    Nothing in it, nor in the ``resolve`` and ``check`` closures it calls (``_make_resolver``,
    ``_make_checker``), looks up a global or builtin name when it runs (``test_python_exec``'s
    ``test_the_guard_hook_looks_up_no_global_or_builtin_name`` checks that), so code that replaces
    ``os.path.realpath``, ``builtins.isinstance`` or this module's functions cannot change its decisions.
    """
    fsdecode, denied = os.fsdecode, PermissionError
    write_flags = _WRITE_FLAGS
    write_events, read_events = dict(_WRITE_PATH_EVENTS), dict(_READ_PATH_EVENTS)
    process_events, network_events = _PROCESS_EVENTS, _NETWORK_EVENTS
    native_events, introspection_events, blocked_imports = _NATIVE_EVENTS, _INTROSPECTION_EVENTS, _BLOCKED_IMPORTS
    resolve = _make_resolver()
    check = _make_checker(resolve, work_dir, read_roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            write = (mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                (flags or 0) & write_flags) != 0
            check(path, write, event)
        elif event in write_events:
            for index in write_events[event]:
                check(args[index], True, event)
        elif event in read_events:
            for index in read_events[event]:
                check(args[index], False, event)
        elif event == "os.symlink":
            target, link = args[0], args[1]
            check(link, True, event)
            link_path = resolve(fsdecode(link))
            check(link_path[: link_path.rfind("/")] + "/" + fsdecode(target), True, event)
        elif event in process_events:
            raise denied(f"python_exec may not start or signal processes ({event})")
        elif event == "import" and args[0] in blocked_imports:
            raise denied(f"python_exec may not start or signal processes (import {args[0]})")
        elif event in native_events:
            raise denied(f"python_exec may not load native libraries or symbols, or touch raw memory, "
                         f"with ctypes ({event})")
        elif event in introspection_events:
            raise denied(f"python_exec may not trace frames, walk the gc or change resource limits ({event})")
        elif event in network_events and not allow_network:
            raise denied(f"python_exec has no network access ({event}); use the http_request tool")

    return hook


def _set_limits(config: dict) -> None:
    for name, key in (("RLIMIT_CPU", "cpu_seconds"), ("RLIMIT_AS", "memory_bytes"),
                      ("RLIMIT_FSIZE", "file_size_bytes")):
        value = config.get(key)
        if value is None or not hasattr(resource, name):
            continue
        limit = getattr(resource, name)
        _soft, hard = resource.getrlimit(limit)
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(limit, (value, value if name != "RLIMIT_CPU" else value + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _preload() -> None:
    """Import what the hook would otherwise refuse at import time, and take ``fork_exec`` away.

    ``ctypes`` opens the interpreter itself (``pythonapi``) when imported, which the hook refuses
    afterwards, so it is imported here; ``subprocess`` brings ``_posixsubprocess``, whose
    ``fork_exec`` starts processes without an audit event, so that function is deleted.
    """
    try:
        import ctypes  # noqa: F401
    except ImportError:
        pass
    import subprocess

    posix_subprocess = sys.modules.get("_posixsubprocess")
    for module in (posix_subprocess, subprocess):
        for name in ("fork_exec", "_fork_exec"):
            if module is not None and hasattr(module, name):
                delattr(module, name)


def _read_roots(config: dict) -> list[str]:
    proc_self = [f"/proc/{os.getpid()}/{name}" for name in _PROC_SELF_FILES]
    return [root for root in config["read_roots"] if not root.startswith("/proc/self")] + proc_self


def main() -> int:
    config = json.loads(sys.argv[1])
    source = sys.stdin.read()
    sys.stdin = open(os.devnull)  # the code gets an empty stdin
    os.chdir(config["work_dir"])
    os.environ.pop("PWD", None)  # set by bwrap; the environment stays the minimal one python_exec gave
    _set_limits(config)
    code = compile(source, "<python_exec>", "exec")
    _preload()
    sys.addaudithook(_make_hook(config["work_dir"], _read_roots(config), bool(config.get("allow_network"))))
    del config, source
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as error:  # show the user's traceback without this file's frames
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != __file__]
        sys.stderr.write("Traceback (most recent call last):\n")
        sys.stderr.write("".join(traceback.format_list(frames)))
        sys.stderr.write("".join(traceback.format_exception_only(type(error), error)))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SyntaxError as syntax_error:
        traceback.print_exception(type(syntax_error), syntax_error, None)
        sys.exit(1)
