"""Small, self-contained Strands tools for agents: calculator, HTTP, file reading, Python execution.

File and Python tools are built per task by factories that bind them to the task's work dir.
"""

from rllm.tools.calculator import calculator, evaluate_expression
from rllm.tools.file_read import make_file_read_tool, read_file_text
from rllm.tools.gaia_tools import gaia_tools
from rllm.tools.http_request import fetch_url, html_to_text, make_http_request_tool
from rllm.tools.python_exec import describe_isolation, make_python_exec_tool, resolve_sandbox, run_python

__all__ = [
    "calculator",
    "describe_isolation",
    "evaluate_expression",
    "fetch_url",
    "gaia_tools",
    "html_to_text",
    "make_file_read_tool",
    "make_http_request_tool",
    "make_python_exec_tool",
    "read_file_text",
    "resolve_sandbox",
    "run_python",
]
