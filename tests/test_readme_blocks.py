"""Every fenced block of README.md and rag/README.md is checked as written.

Blocks are read with markdown-it (the parser rich already brings), not a hand-rolled regex.
Python blocks must compile as complete programs (imports, ``asyncio.run``), and those that can run
offline run, against the project's stand-ins: the scripted OpenAI-compatible server for a model
server and an in-process retrieval server for ``rag``, their URLs put in place of the README's.
Shell blocks: every command's script or module exists, ``--help`` (of its subcommand) exits 0,
and every ``--flag`` the README passes is one that help lists. What cannot run here is listed
below with the reason, and a block that is in neither list fails the test, so a new block must
be classified.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from rag.testing import RetrievalServer, demo_index
from rllm.testing.scripted_server import ScriptedOpenAIServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "rag/README.md")
LLM_URL = "http://127.0.0.1:30000/v1"  # the README's model server
RAG_URL = "http://127.0.0.1:8000"  # the README's retrieval server

# Python blocks, by a line unique to each: run here (True) or why they cannot run offline on CPU.
PYTHON_BLOCKS: dict[str, bool | str] = {
    "return_token_ids=True, temperature=1.0": True,
    "SGLangEngine(": "needs the hub (Qwen/Qwen3-4B's tokenizer) and an SGLang server; the same loop runs offline "
                     "in tests/rllm/tokens/test_renderer.py",
    "AgentWorkflowEngine(StrandsWorkflow, search_workflow_args": True,
    "AgentWorkflowEngine(StrandsWorkflow, {\"agent_factory\"": True,
    "ProxyProcess(config)": "needs the proxy's own venv (.cache/litellm-venv) and a vLLM backend for token ids; "
                            "tests/rllm/tracing/test_proxy.py runs the proxy against a scripted vLLM",
    "from rag.client import make_local_search_tool\nlocal_search": True,
    "RetrievalClient(\"http://127.0.0.1:8000\")": True,
    "distance_compute_blas_threshold = threshold": True,
}
# Shell commands, by their first words: not run (not even --help), and why.
NOT_RUN_COMMANDS: dict[str, str] = {
    "python3 -m venv": "creates a venv and installs packages from the network; .ci/run runs the set-up line itself",
    "pip install": "installs packages from the network",
    ".venv/bin/pip install": "installs packages from the network",
    ".venv/bin/ruff": "the CI command itself (.ci/run runs it)",
    ".venv/bin/mypy": "the CI command itself (.ci/run runs it)",
    ".venv/bin/python -m pytest": "the CI command itself (.ci/run runs it)",
    "git worktree": "needs a clone's full history and writes outside the repo",
}
# Scripts whose extra flags go to another program: check them against that program's help too.
PASSES_FLAGS_TO = {"rag/launch_rag.sh": [sys.executable, "-m", "rag.server"]}
# Scripts whose first flag picks another program (with its own --help), like a subcommand.
MODE_FLAGS = {"scripts/quickstart.sh": ("--search",)}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and its text."""

    path: str
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for name in READMES:
        for token in MarkdownIt().parse((ROOT / name).read_text()):
            if token.type == "fence" and token.map:
                found.append(Block(name, token.map[0] + 1, token.info.strip(), token.content))
    return found


BLOCKS = _blocks()
PY = [b for b in BLOCKS if b.lang == "python"]
SH = [b for b in BLOCKS if b.lang == "bash"]


def _key(block: Block) -> str:
    keys = [k for k in PYTHON_BLOCKS if k in block.text]
    assert len(keys) == 1, f"{block.where}: a Python block must match exactly one PYTHON_BLOCKS key, got {keys}"
    return keys[0]


def test_every_block_is_python_bash_or_plain_text() -> None:
    assert {b.lang for b in BLOCKS} <= {"python", "bash", ""}, [(b.where, b.lang) for b in BLOCKS]
    assert len(PY) == len(PYTHON_BLOCKS), "each PYTHON_BLOCKS entry must name one block"
    assert {_key(b) for b in PY} == set(PYTHON_BLOCKS)


@pytest.mark.parametrize("block", PY, ids=[b.where for b in PY])
def test_python_block_compiles_as_a_complete_program(block: Block) -> None:
    compile(block.text, block.where, "exec")  # top-level await would be a SyntaxError here


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The scripted model server and a retrieval server over the demo index, by the README URL they replace."""
    with ScriptedOpenAIServer() as llm, RetrievalServer(demo_index(tmp_path_factory.mktemp("rag"), 40)) as rag:
        yield {LLM_URL: llm.base_url, RAG_URL: rag.base_url}


RUN = [b for b in PY if PYTHON_BLOCKS[_key(b)] is True]
SKIPPED = [b for b in PY if PYTHON_BLOCKS[_key(b)] is not True]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_python_block_runs_offline_against_the_stand_ins(block: Block, stand_ins: dict[str, str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    source = block.text
    for readme_url, local_url in stand_ins.items():
        source = source.replace(readme_url, local_url)
    monkeypatch.chdir(tmp_path)  # what a block writes (runs/...) stays out of the repo
    exec(compile(source, block.where, "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out or "print(" not in source


@pytest.mark.parametrize("block", SKIPPED, ids=[b.where for b in SKIPPED])
def test_python_block_that_cannot_run_here(block: Block) -> None:
    pytest.skip(f"{block.where}: {PYTHON_BLOCKS[_key(block)]}")


# --------------------------------------------------------------------------------------- shell
def _commands(block: Block) -> Iterator[list[str]]:
    """Each command of a shell block as words: continuations joined, comments, ``&`` and env settings dropped."""
    for line in block.text.replace("\\\n", " ").splitlines():
        for part in re.split(r"\s&&\s", line):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)
            if words and words[-1] == "&":
                words.pop()
            if words:
                yield words


def _not_run(words: list[str]) -> str | None:
    line = " ".join(words)
    return next((why for prefix, why in NOT_RUN_COMMANDS.items() if line.startswith(prefix)), None)


def _help_command(words: list[str]) -> list[str]:
    """The command's program (and subcommand words) with ``--help``: ``python X.py``, ``python -m M``, ``bash X.sh``."""
    program, rest = words[0], words[1:]
    if program == "bash":
        assert (ROOT / rest[0]).is_file(), f"no script {rest[0]}"
        head, rest = ["bash", rest[0]], rest[1:]
        if rest and rest[0] in MODE_FLAGS.get(head[1], ()):
            head.append(rest.pop(0))
    elif program in ("python", "python3", ".venv/bin/python"):
        if rest[0] == "-m":
            assert importlib.util.find_spec(rest[1]) is not None, f"no module {rest[1]}"
            head, rest = [sys.executable, "-m", rest[1]], rest[2:]
        else:
            assert (ROOT / rest[0]).is_file(), f"no script {rest[0]}"
            head, rest = [sys.executable, rest[0]], rest[1:]
    else:
        raise AssertionError(f"unknown program {program!r}: classify it in NOT_RUN_COMMANDS")
    while rest and re.fullmatch(r"[a-z_]+", rest[0]):  # subcommands such as `proxy start`
        head.append(rest.pop(0))
    return [*head, "--help"]


def _shell_cases() -> list[tuple[str, list[str]]]:
    return [(f"{b.where} {' '.join(w)[:60]}", w) for b in SH for w in _commands(b)]


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Every distinct ``--help`` the READMEs' commands need, run in parallel (each is an interpreter start)."""
    needed: set[tuple[str, ...]] = set()
    for _, words in _shell_cases():
        if _not_run(words) is None and not (words[0].endswith("python") and words[1] == "-c"):
            needed.add(tuple(_help_command(words)))
            needed.update(tuple([*p, "--help"]) for s, p in PASSES_FLAGS_TO.items() if s in words)

    def run(command: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "OTEL_SDK_DISABLED": "true",
                                   "PYTHON": sys.executable})

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(needed, pool.map(run, needed), strict=True))


@pytest.mark.parametrize(("case", "words"), _shell_cases(), ids=[c for c, _ in _shell_cases()])
def test_shell_command_exists_and_takes_its_flags(case: str, words: list[str], helps) -> None:
    if (why := _not_run(words)) is not None:
        pytest.skip(why)
    if words[0].endswith("python") and words[1] == "-c":
        compile(words[2], case, "exec")
        return
    command = tuple(_help_command(words))
    run = helps[command]
    assert run.returncode == 0, f"{' '.join(command)} exited {run.returncode}: {run.stderr[-2000:]}"
    text = run.stdout + run.stderr
    for script, program in PASSES_FLAGS_TO.items():
        if script in words:
            text += helps[(*program, "--help")].stdout
    flags = {w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")}
    missing = sorted(f for f in flags if f != "--help" and f not in text)
    assert not missing, f"{case}: {missing} not in `{' '.join(command)}`"
