"""Imports point one way: a module may import its own layer or lower ones, never a higher one.

The layer order is ARCHITECTURE.md's, lowest first. Every ``import`` and ``from ... import`` in the
library's files is read with ``ast`` (lazy imports inside functions included), so a lower layer
importing a higher one fails here with the file, the line and both layers named.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core records, tokens and errors", ("rllm.errors", "rllm.retry", "rllm.transport", "rllm.types", "rllm.records", "rllm.tokens", "rllm.parser", "rllm.processes", "rllm.secret_options")),
    ("rollout engines", ("rllm.engine",)),
    ("offline kit: tiny models, the real tokenizer's templates, scripted servers", ("rllm.offline",)),
    ("task pieces: data, rewards, tools, retrieval", ("rllm.data", "rllm.rewards", "rllm.tools", "rag")),
    ("trace capture", ("rllm.tracing",)),
    ("Strands integration", ("rllm.integrations.strands",)),
    ("workflows and the batch runner", ("rllm.workflows",)),
    ("agents", ("rllm.agents",)),
    ("training: verl and local", ("rllm.training", "rllm.trainer")),
    ("evaluation", ("rllm.eval",)),
    ("the quickstart and the learning proofs: train, then evaluate", ("rllm.proofs",)),
    ("the viewer: runs and evaluations in a browser", ("rllm.viewer",)),
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


_DOTTED = re.compile(r"^(?:pkg://)?((?:rllm|rag)(?:\.\w+)+)(?::\w+)?$")


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node.strip()
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _upward_dotted_paths(yaml_text: str, source_module: str) -> list[str]:
    """Values of a shipped YAML that name a module (``pkg.module:attr``, ``pkg://...``) in a higher layer."""
    source = _layer(source_module)
    found = []
    for value in _strings(yaml.safe_load(yaml_text)):
        match = _DOTTED.match(value)
        target = _layer(match.group(1)) if match else None
        if source is not None and target is not None and target > source:
            found.append(f"{value} ({LAYERS[target][0]})")
    return found


def test_dotted_paths_in_shipped_yaml_point_down() -> None:
    """A recipe names tools, scorers and classes by string; those strings obey the layer order too."""
    files = sorted(p for package in ("rllm", "rag") for p in (ROOT / package).rglob("*.yaml"))
    assert files, "no shipped YAML found"
    violations = []
    for path in files:
        module = _module_name(path.parent)
        violations += [f"{path.relative_to(ROOT)} ({LAYERS[_layer(module)][0]}) names {v}"
                       for v in _upward_dotted_paths(path.read_text(encoding="utf-8"), module)]
    assert not violations, "dotted paths that point up a layer:\n" + "\n".join(violations)


def test_the_yaml_check_sees_a_path_that_points_up() -> None:
    recipe = "rllm:\n  agent_loop:\n    tool_factory: rllm.agents.search:search_tools\n  note: rllm.agent_loop\n"
    assert _upward_dotted_paths(recipe, "rllm.training.verl.config") == []
    assert _upward_dotted_paths(recipe, "rllm.workflows") == ["rllm.agents.search:search_tools (agents)"]
    assert _upward_dotted_paths("reward:\n  path: pkg://rllm.eval.search\n", "rllm.agents") == [
        "pkg://rllm.eval.search (evaluation)"]


MAX_FUNCTION_LINES = 100
"""The longest a library function may be, from its ``def`` line to its last line (docstring included)."""


def _long_functions(source: str, filename: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (N lines)`` for every function or method in ``source`` longer than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append(f"{filename}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_library_function_is_over_100_lines() -> None:
    long = [f for path in _library_files()
            for f in _long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into private helpers): {long}"


def test_the_length_check_sees_a_long_function_nested_or_not() -> None:
    def function(name: str, lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))

    assert _long_functions(function("fits", MAX_FUNCTION_LINES), "m.py") == []
    assert _long_functions(function("long", MAX_FUNCTION_LINES + 1), "m.py") == ["m.py:1 long (101 lines)"]
    nested = "class C:\n" + function("method", MAX_FUNCTION_LINES + 1, indent="    ")
    assert _long_functions(nested, "m.py") == ["m.py:2 method (101 lines)"]


RUNNER = "rllm/integrations/strands/runner.py"
"""The one module that calls an agent factory (``rllm.integrations.strands.runner``)."""
_FACTORY_NAMES = frozenset({"agent_factory", "factory", "build_agent"})
"""How a call of an agent factory is spelled: ``agent_factory(...)``, ``self.factory(...)``, ``build_agent(...)``."""


def _callee_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _factory_calls(source: str, filename: str) -> list[str]:
    """``file:line`` of every call of an agent factory in ``source``.

    A call of a name or attribute in ``_FACTORY_NAMES``, and a call of what ``import_object`` returns
    for one (``import_object(settings.agent_factory)(model, task)``).
    """
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if _callee_name(callee) in _FACTORY_NAMES:
            found.append(f"{filename}:{node.lineno} {ast.unparse(callee)}(...)")
        elif isinstance(callee, ast.Call) and _callee_name(callee.func) == "import_object" and any(
                _callee_name(part) in _FACTORY_NAMES for arg in callee.args for part in ast.walk(arg)
                if isinstance(part, ast.expr)):
            found.append(f"{filename}:{node.lineno} {ast.unparse(callee)}(...)")
    return found


def test_only_the_runner_calls_an_agent_factory() -> None:
    """The verl loop, the preflight, the prompt measure, the local trainer and ``StrandsWorkflow`` run through it."""
    calls = [call for path in _library_files() if str(path.relative_to(ROOT)) != RUNNER
             for call in _factory_calls(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not calls, f"agent factories called outside {RUNNER} (build and run through its build_rollout): {calls}"
    assert _factory_calls((ROOT / RUNNER).read_text(encoding="utf-8"), RUNNER), "the runner calls no factory"


def test_the_factory_check_sees_every_spelling_of_a_factory_call() -> None:
    """A tool factory imported and called, or a factory passed on without a call, is no factory call."""
    source = ("built = agent_factory(model, task)\n"
              "built = self.factory(self.model, task)\n"
              "agent = build_agent(model, tools=[], system_prompt=None)\n"
              "built = import_object(settings.agent_factory)(model, task)\n"
              "tools = import_object(tool_factory)(**kwargs)\n"
              "choice = AgentChoice(agent_factory=agent_factory)\n")
    assert [call.split(" ", 1)[0] for call in _factory_calls(source, "m.py")] == ["m.py:1", "m.py:2", "m.py:3",
                                                                               "m.py:4"]
