"""``bench_trainers.py --profile``: a real process named as Ray names its workers, sampled by the real py-spy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from _bench_trainers_profile import RayProfile, py_spy  # noqa: E402

SPIN = """
import time
def busy_frame_of_the_worker():
    end = time.monotonic() + 4
    while time.monotonic() < end:
        sum(range(10_000))
busy_frame_of_the_worker()
"""


@pytest.mark.skipif(py_spy() is None, reason="py-spy comes with ray[default]")
def test_the_profile_names_each_ray_process_its_cpu_and_its_hottest_frame(tmp_path: Path) -> None:
    worker = subprocess.Popen(["bash", "-c", f'exec -a "ray::SpinWorker.run" {sys.executable} -c "$0"', SPIN])
    try:
        time.sleep(0.5)  # the process has its name
        profile = RayProfile(tmp_path, rate=100)
        profile.start()
        time.sleep(2)
        profile.sample_cpu()
        worker.wait(timeout=30)
        result = profile.finish()
    finally:
        worker.kill()
    mine = [p for p in result["processes"] if p["pid"] == worker.pid]
    assert [p["process"] for p in mine] == ["SpinWorker.run"]
    assert mine[0]["cpu_seconds"] >= 1.0  # two seconds of a spinning loop, read from the process itself
    if mine[0]["samples"] == 0:
        pytest.skip("py-spy could not attach here (ptrace refused)")
    assert "busy_frame_of_the_worker" in " ".join(frame["frame"] for frame in mine[0]["top"])
    assert (tmp_path / "profile.json").is_file()
