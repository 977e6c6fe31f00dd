"""Errors are imported from the module that defines them (``rllm.errors``, or ``rag.errors`` for the retrieval service's).

No other module re-exports one (in ``__all__`` or by being imported from), so there is one import
line for an error, whatever module raises it. Every ``import`` in the library, the examples, the
scripts, the tests and the Python blocks of the docs is read with ``ast``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_HOMES = ("rllm.errors", "rag.errors")
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _defined(module: str) -> set[str]:
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


ERRORS = {name: home for home in _HOMES for name in _defined(home)}


def _sources() -> list[tuple[str, str]]:
    """(where, Python source) for every .py file and every Python block of the Markdown docs."""
    found = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
             for folder in ("rllm", "rag", "examples", "scripts", "tests") for p in sorted((ROOT / folder).rglob("*.py"))]
    for doc in sorted([*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "rag").rglob("*.md")]):
        for n, block in enumerate(_BLOCK.findall(doc.read_text(encoding="utf-8")), 1):
            found.append((f"{doc.relative_to(ROOT)} (python block {n})", block))
    return found


def _offences(where: str, source: str) -> list[str]:
    """Imports of an error from a module other than its home, and ``__all__`` entries naming one."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a doc block with an elision (``...`` in an argument list) is not checked
        return []
    offences = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            offences += [f"{where}:{node.lineno}: {alias.name} from {node.module}, not {ERRORS[alias.name]}"
                         for alias in node.names if alias.name in ERRORS and node.module != ERRORS[alias.name]]
    home = where.removesuffix(".py").replace("/", ".")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
            offences += [f"{where}:{node.lineno}: __all__ re-exports {name}" for name in names
                         if name in ERRORS and ERRORS[name] != home]
    return offences


def test_errors_are_imported_from_their_home_only() -> None:
    offences = [o for where, source in _sources() for o in _offences(where, source)]
    assert not offences, "import these errors from where they are defined:\n" + "\n".join(offences)


@pytest.mark.parametrize(("source", "found"), [
    ("from rllm.engine.rollout import EngineError\n", "EngineError from rllm.engine.rollout, not rllm.errors"),
    ("from rag.client import RetrievalError\n", "RetrievalError from rag.client, not rag.errors"),
    ("from rllm.errors import BlockedDestinationError\n__all__ = ['BlockedDestinationError']\n",
     "__all__ re-exports BlockedDestinationError"),
])
def test_the_check_sees_a_re_export(source: str, found: str) -> None:
    assert any(found in offence for offence in _offences("rllm/tools/x.py", source))
    assert not _offences("rllm/tools/x.py", "from rllm.errors import EngineError\nfrom rag.errors import Overloaded\n")
