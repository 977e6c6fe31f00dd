"""``install_proxy_venv`` installs LiteLLM with uv where the project's environment has it, else with pip.

No network here: the environment builder and the installer are stand-ins that record what they were asked; the
real install runs in ``tests/rllm/tracing/test_proxy.py`` (with the uv the set-up commands put into ``.venv``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rllm.tracing import proxy


@pytest.fixture
def installs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """The commands ``install_proxy_venv`` runs; the venv it creates is a folder with a ``bin/python`` file."""
    commands: list[list[str]] = []

    class _Builder:
        def __init__(self, **kwargs: Any) -> None:
            pass

        def create(self, root: Path) -> None:
            (Path(root) / "bin").mkdir(parents=True)
            (Path(root) / "bin" / "python").touch()

    def _run(command: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        (Path(command[command.index("--python") + 1] if "--python" in command else command[0]).parent
         / "litellm").touch()
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(proxy.venv, "EnvBuilder", _Builder)
    monkeypatch.setattr(proxy.subprocess, "run", _run)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "project" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return commands


def test_the_uv_beside_this_interpreter_installs_litellm_without_bytecode(installs: list[list[str]],
                                                                          tmp_path: Path) -> None:
    uv = tmp_path / "project" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.touch()

    root = proxy.install_proxy_venv(tmp_path / "litellm-venv")

    assert installs == [[str(uv), "pip", "install", "-q", "--python", str(root / "bin" / "python"),
                         f"litellm[proxy]=={proxy.LITELLM_VERSION}"]]
    assert "--compile-bytecode" not in installs[0]
    assert proxy.find_proxy_venv(root) == root
    assert json.loads((root / "rllm-proxy-venv.json").read_text())["litellm"] == proxy.LITELLM_VERSION


def test_without_uv_pip_installs_litellm_without_bytecode(installs: list[list[str]], tmp_path: Path) -> None:
    root = proxy.install_proxy_venv(tmp_path / "litellm-venv")

    assert installs == [[str(root / "bin" / "python"), "-m", "pip", "-q", "install", "--disable-pip-version-check",
                         "--no-compile", f"litellm[proxy]=={proxy.LITELLM_VERSION}"]]
    assert proxy.find_proxy_venv(root) == root
