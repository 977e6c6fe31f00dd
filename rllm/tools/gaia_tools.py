"""The GAIA agent's tool set, built per task so file and Python access are bound to its work dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm.tools.calculator import calculator
from rllm.tools.file_read import make_file_read_tool
from rllm.tools.http_request import make_http_request_tool
from rllm.tools.python_exec import make_python_exec_tool


def gaia_tools(
    work_dir: Path,
    *,
    python_timeout: float = 30.0,
    http_timeout: float = 20.0,
    allow_network_in_python: bool = False,
    include_http: bool = True,
    python_sandbox: str = "bwrap",
    http_allowed_networks: tuple[str, ...] = (),
) -> list[Any]:
    """``[calculator, http_request, file_read, python_exec]`` for one task's ``work_dir``.

    ``include_http=False`` leaves out the HTTP tool (offline evaluations). ``python_sandbox`` is
    ``python_exec``'s isolation (``"bwrap"``, ``"auto"`` or ``"guard"``, see ``rllm.tools.python_exec``);
    ``http_allowed_networks`` are private networks ``http_request`` may reach all the same.
    """
    work_dir = Path(work_dir)
    tools: list[Any] = [calculator]
    if include_http:
        tools.append(make_http_request_tool(timeout=http_timeout, allowed_networks=http_allowed_networks))
    tools.append(make_file_read_tool(work_dir))
    tools.append(make_python_exec_tool(work_dir, timeout=python_timeout, allow_network=allow_network_in_python,
                                       sandbox=python_sandbox))
    return tools
