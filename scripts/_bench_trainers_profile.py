"""Where verl's steps spend their CPU: each Ray process's CPU seconds and py-spy's hottest frames, after step 1.

Used by ``bench_trainers.py --profile DIR``. When verl's first step is logged, every ``ray::`` process on
this machine (verl's task runner, FSDP worker, the embedded rollout server, the agent-loop worker, the
reward worker, the request load balancer, ...) gets its CPU time read and a ``py-spy record`` attached
(non-blocking, raw collapsed stacks); at the end the CPU each spent over the remaining steps and the frames
that held most samples are summed per process. Start-up (imports, Ray, the first step's warm-up) is left out,
so what remains is the steady-state step the benchmark's medians time. The samplers take CPU from the run's
own processes on a small machine (on 2 cores at 50 samples a second, verl's step took 41.6 s profiled against
25.8 s not): the CPU seconds are the processes' own, but take the trainers' ratio from a run without ``--profile``.
"""

from __future__ import annotations

import collections
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

logger = logging.getLogger("bench_trainers.profile")

TOP_FRAMES = 8
RAY_OWN = ("IDLE", "DashboardAgent", "RuntimeEnvAgent")
"""Ray's own workers: their CPU is read, but py-spy is not attached (each sampler takes CPU from the run)."""


@dataclass
class _Target:
    pid: int
    name: str
    cpu_start: float
    output: Path
    recorder: subprocess.Popen[bytes] | None = None
    cpu_end: float | None = None


@dataclass
class RayProfile:
    """Attach to the ``ray::`` processes once (``start``), read them when the run is over (``finish``)."""

    out: Path
    rate: int = 20
    targets: list[_Target] = field(default_factory=list)
    started_at: float | None = None

    def start(self) -> None:
        """Read every ``ray::`` process's CPU time and attach py-spy to it (py-spy missing: CPU times only)."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        spy = py_spy()
        if spy is None:
            logger.warning("py-spy is not installed (it comes with ray[default]): CPU times only")
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = process.info["cmdline"] or []
            if not cmdline or not cmdline[0].startswith("ray::"):
                continue
            name = cmdline[0].removeprefix("ray::").split(" ")[0]
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            target = _Target(process.pid, name, times.user + times.system, self.out / f"{name}-{process.pid}.txt")
            if spy is not None and name not in RAY_OWN:
                target.recorder = subprocess.Popen(
                    [spy, "record", "--nonblocking", "--format", "raw", "--rate", str(self.rate), "--pid",
                     str(process.pid), "--output", str(target.output)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.targets.append(target)
        logger.info("profiling %d Ray processes: %s", len(self.targets), sorted(t.name for t in self.targets))

    def sample_cpu(self) -> None:
        """Read each target's CPU time now (call it while the run is alive: its processes go when it ends)."""
        for target in self.targets:
            try:
                times = psutil.Process(target.pid).cpu_times()
            except psutil.Error:
                continue
            target.cpu_end = times.user + times.system

    def finish(self) -> dict[str, Any]:
        """Stop the recorders; per process: CPU seconds since ``start`` and its hottest frames (self time)."""
        wall = time.monotonic() - (self.started_at or time.monotonic())
        processes = []
        for target in self.targets:
            if target.recorder is not None:
                try:
                    target.recorder.wait(timeout=30)  # py-spy stops when its target exits
                except subprocess.TimeoutExpired:
                    target.recorder.send_signal(2)
                    target.recorder.wait(timeout=30)
            cpu = None if target.cpu_end is None else round(target.cpu_end - target.cpu_start, 1)
            processes.append({"process": target.name, "pid": target.pid, "cpu_seconds": cpu,
                              **_top_frames(target.output)})
        processes.sort(key=lambda p: -(p["cpu_seconds"] or 0))
        result = {"wall_seconds": round(wall, 1), "processes": processes}
        (self.out / "profile.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        return result


def py_spy() -> str | None:
    """py-spy beside this Python (a venv's ``bin/``, not always on ``PATH``), else on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _top_frames(raw: Path) -> dict[str, Any]:
    """The frames that were on top of most samples (self) in a py-spy raw file, idle waits apart."""
    if not raw.exists():
        return {"samples": 0, "top": []}
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        leaf[stack.split(";")[-1].strip()] += int(count)
    return {"samples": total, "top": [{"frame": frame, "share": round(n / total, 3)}
                                      for frame, n in leaf.most_common(TOP_FRAMES)]}


def print_profile(result: dict[str, Any]) -> None:
    """The per-process CPU and each busy process's top frames, as the benchmarks table quotes them."""
    print(f"\nCPU per Ray process after verl's step 1 ({result['wall_seconds']} s of wall time):")
    for process in result["processes"]:
        cpu = "?" if process["cpu_seconds"] is None else process["cpu_seconds"]
        print(f"  {process['process']:<40} {cpu:>7} s")
        for frame in process["top"][:4]:
            print(f"      {frame['share']:6.1%}  {frame['frame'][:110]}")
