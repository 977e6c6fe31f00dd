"""Imports point one way: a module may import its own layer or lower ones, never a higher one.

The layer order is ARCHITECTURE.md's, lowest first. Every ``import`` and ``from ... import`` in the
library's files is read with ``ast`` (lazy imports inside functions included), so a lower layer
importing a higher one fails here with the file, the line and both layers named.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core records, tokens and errors", ("rllm.errors", "rllm.retry", "rllm.types", "rllm.tokens", "rllm.parser", "rllm.processes")),
    ("rollout engines", ("rllm.engine",)),
    ("test kit", ("rllm.testing",)),
    ("task pieces: data, rewards, tools, retrieval", ("rllm.data", "rllm.rewards", "rllm.tools", "rag")),
    ("trace capture", ("rllm.tracing",)),
    ("Strands integration", ("rllm.integrations.strands",)),
    ("workflows and the batch runner", ("rllm.workflows",)),
    ("verl adapter", ("rllm.integrations.verl",)),
    ("agents", ("rllm.agents",)),
    ("local training", ("rllm.training",)),
    ("evaluation", ("rllm.eval",)),
]
"""Lowest first. The package files ``rllm/__init__.py`` and ``rllm/integrations/__init__.py`` only name what is inside."""


def _layer(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def _library_files() -> list[Path]:
    return sorted(p for package in ("rllm", "rag") for p in (ROOT / package).rglob("*.py"))


def test_every_library_module_has_a_layer() -> None:
    unplaced = [_module_name(p) for p in _library_files() if _module_name(p) not in {"rllm", "rllm.integrations"} and _layer(_module_name(p)) is None]
    assert not unplaced, f"modules in no layer of ARCHITECTURE.md (add them to LAYERS and the doc): {unplaced}"


def test_no_lower_layer_imports_a_higher_one() -> None:
    violations = []
    for path in _library_files():
        source = _layer(_module_name(path))
        if source is None:
            continue
        for line, imported in _imports(path):
            target = _layer(imported)
            if target is not None and target > source:
                violations.append(f"{path.relative_to(ROOT)}:{line} ({LAYERS[source][0]}) imports {imported} "
                                  f"({LAYERS[target][0]})")
    assert not violations, "imports that point up a layer:\n" + "\n".join(violations)


_EXAMPLE_MODULES = tuple(sorted(p.stem for p in (ROOT / "examples").rglob("*.py")))


@pytest.mark.parametrize("folder", ["tests", "scripts", "rllm", "rag"])
def test_nothing_imports_from_examples(folder: str) -> None:
    offenders = []
    for path in (ROOT / folder).rglob("*.py"):
        name = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        loads = "sys.path.insert" in text or "spec_from_file_location" in text
        named = [m for m in _EXAMPLE_MODULES if f"{m}.py" in text or f"from {m} import" in text]
        if path != Path(__file__) and loads and named:
            offenders.append(name)
    assert not offenders, f"examples/ holds scripts that call the library; nothing imports them: {offenders}"


def test_the_layer_order_is_the_documented_one() -> None:
    doc = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    positions = [doc.index(f"`{prefixes[0].replace('.', '/')}") for _, prefixes in LAYERS]
    assert positions == sorted(positions), "ARCHITECTURE.md lists the layers in another order than LAYERS"
