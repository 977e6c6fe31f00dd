"""Every fenced block of the README, the manual (docs/) and the other Markdown it shows is checked as written.

The pages walked are README.md, rag/README.md, ARCHITECTURE.md, CHANGELOG.md and every ``docs/**/*.md``.

Blocks are read with markdown-it (the parser rich already brings), not a hand-rolled regex.
Python blocks must compile as complete programs (imports, ``asyncio.run``), and those that can run
offline run, against the project's stand-ins: the scripted OpenAI-compatible server for a model
server and an in-process retrieval server for ``rag``, their URLs put in place of the pages'.
Shell blocks: every command's script or module exists, ``--help`` (of its subcommand) exits 0,
and every ``--flag`` a page passes is one that help lists. What cannot run here is listed
below with the reason, and a block that is in neither list fails the test, so a new block must
be classified. A Python block may be copied to a second page (the README's ``Use`` snippet is also on
the Strands page): the copy must be identical, and the block runs once.

The README is a front page: at most 200 lines, both set-up commands in its first 60 lines, no commit
hash and no sentence about how or where the project was developed (its history is in the changelog,
its figures in ``docs/benchmarks.md``, whose every row is dated and names its machine and command).
"""

from __future__ import annotations

import importlib
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
from rllm.offline.scripted_server import ScriptedOpenAIServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "rag/README.md", "ARCHITECTURE.md", "CHANGELOG.md",
         *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")))
LLM_URL = "http://127.0.0.1:30000/v1"  # the pages' model server
RAG_URL = "http://127.0.0.1:8000"  # the pages' retrieval server

# Python blocks, by a line unique to each: run here (True) or why they cannot run offline on CPU.
PYTHON_BLOCKS: dict[str, bool | str] = {
    "return_token_ids=True, temperature=1.0": True,
    "SGLangEngine(": "needs the hub (Qwen/Qwen3-4B's tokenizer) and an SGLang server; the same loop runs offline "
                     "in tests/rllm/tokens/test_renderer.py",
    "AgentWorkflowEngine(StrandsWorkflow, search_workflow_args": True,
    # docs/train-your-own-agent.md: six blocks that build on each other (a module, a model, an evaluation, a
    # training run, the trained model's evaluation, a LoRA run), run in order by the page's own test, which asserts what they do.
    "# my_agents.py": "a module the page's later blocks import; run in order by "
                      "tests/rllm/training/test_agent_trainer_cpu.py",
    "end_turns_early(build_tiny_qwen3(": "run in order by tests/rllm/training/test_agent_trainer_cpu.py",
    "TransformersEngine(\"runs/tiny-qwen3\"": "imports the page's my_agents.py; run in order by "
                                              "tests/rllm/training/test_agent_trainer_cpu.py",
    "trainer = AgentTrainer(": "a verl run on CPU (two steps); run in order by "
                               "tests/rllm/training/test_agent_trainer_cpu.py",
    "train_dataset=tasks).train()": "trains Qwen3-4B on 8 GPUs and imports the reader's my_agents.py; the same call "
                                    "on a tiny model and CPU runs in tests/rllm/training/test_agent_trainer_cpu.py",
    "\"actor_rollout_ref.model.lora_rank\": 8": "a verl LoRA run on CPU (two steps); run in order by "
                                                "tests/rllm/training/test_agent_trainer_cpu.py",
    "final_model_dir(Path(\"runs/mine\"))": "evaluates the model the page's training run exported; run in order "
                                             "by tests/rllm/training/test_agent_trainer_cpu.py",
    "dict(agent_factory=my_agent, reward_fn=my_reward)": True,
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
    "vllm serve": "vLLM needs a GPU and does not install here; the adapter it serves is loaded with peft by "
                  "tests/rllm/training/test_agent_trainer_cpu.py",
    ".venv/bin/pip install": "installs packages from the network",
    ".venv/bin/uv pip install": "installs packages from the network",
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
    for name in PAGES:
        for token in MarkdownIt().parse((ROOT / name).read_text(encoding="utf-8")):
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


def test_the_pages_walked_include_the_manual() -> None:
    assert {"docs/index.md", "docs/strands.md", "docs/train-your-own-agent.md", "docs/benchmarks.md"} <= set(PAGES)


def test_every_block_is_python_bash_or_plain_text() -> None:
    assert {b.lang for b in BLOCKS} <= {"python", "bash", ""}, [(b.where, b.lang) for b in BLOCKS]
    assert {_key(b) for b in PY} == set(PYTHON_BLOCKS), "each PYTHON_BLOCKS entry must name a block"


def _first_by_key() -> dict[str, Block]:
    first: dict[str, Block] = {}
    for block in PY:
        first.setdefault(_key(block), block)
    return first


COPIES = [b for b in PY if _first_by_key()[_key(b)] is not b]


@pytest.mark.parametrize("block", COPIES, ids=[b.where for b in COPIES])
def test_a_python_block_on_two_pages_is_the_same_block(block: Block) -> None:
    original = _first_by_key()[_key(block)]
    assert block.text == original.text, f"{block.where} differs from {original.where}: copy it whole or key it apart"


@pytest.mark.parametrize("block", PY, ids=[b.where for b in PY])
def test_python_block_compiles_as_a_complete_program(block: Block) -> None:
    compile(block.text, block.where, "exec")  # top-level await would be a SyntaxError here


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The scripted model server and a retrieval server over the demo index, by the page URL they replace."""
    with ScriptedOpenAIServer() as llm, RetrievalServer(demo_index(tmp_path_factory.mktemp("rag"), 40)) as rag:
        yield {LLM_URL: llm.base_url, RAG_URL: rag.base_url}


RUN = [b for b in PY if PYTHON_BLOCKS[_key(b)] is True and b not in COPIES]
SKIPPED = [b for b in PY if PYTHON_BLOCKS[_key(b)] is not True and b not in COPIES]


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
    """Every distinct ``--help`` the pages' commands need, run in parallel (each is an interpreter start)."""
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


# ---------------------------------------------------------------------------------- the front page
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Hex words of 7 to 40 characters holding a digit and a letter: what a commit hash looks like.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# Phrases of a lab notebook: how, where or when the project was developed or measured.
DEVELOPMENT_PHRASES = re.compile(
    r"development (machine|checkout)|developed on|this (VM|session|work)\b|machines? this (repo|project|work)"
    r"|(was|were) (not )?lent|built on the machine|at commit|(earlier|an earlier) session|measured (on|at|in) ",
    re.IGNORECASE)


def _test_command() -> str:
    """The command .ci/run runs: the README's lines between the test-command markers, fences dropped."""
    inside = README.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    (command,) = [line for line in inside.splitlines() if line.strip() and not line.startswith("```")]
    return command


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= 200, "the README is the front page: move detail to a page of docs/"


def test_both_set_up_commands_are_in_the_readmes_first_60_lines() -> None:
    first_screen = README.splitlines()[:60]
    quickstart = [line for line in first_screen
                  if line.startswith("python3 -m venv .venv") and line.endswith("bash scripts/quickstart.sh")]
    assert len(quickstart) == 1, "the quickstart's set-up command is not in the README's first 60 lines"
    assert _test_command() in first_screen, "the test command is not in the README's first 60 lines"


def test_the_readme_holds_no_commit_hash() -> None:
    assert not COMMIT_HASH.findall(README), "commit hashes belong in docs/benchmarks.md or the changelog"


def test_the_readme_says_nothing_of_how_or_where_the_project_was_developed() -> None:
    found = [line for line in README.splitlines() if DEVELOPMENT_PHRASES.search(line)]
    assert not found, f"history belongs in CHANGELOG.md, measurements in docs/benchmarks.md: {found}"


def test_the_checks_catch_what_they_look_for() -> None:
    assert COMMIT_HASH.search("measured at f784059 on") and COMMIT_HASH.search("(commit 0496c93, 6 min)")
    assert not COMMIT_HASH.search("accessed 2026-11-27, 1,000 boxes, deadbeef, 1234567")
    assert DEVELOPMENT_PHRASES.search("Measured on the 2-core development machine")
    assert not DEVELOPMENT_PHRASES.search("Train a Strands tool agent through verl's own trainer, on this machine:")


# ----------------------------------------------------------------------------------- benchmarks
def _tables(text: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_every_benchmark_row_is_dated_and_names_its_machine_and_command() -> None:
    tables = _tables((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    assert tables
    for header, _, *rows in tables:
        assert header[:3] == ["date", "machine", "command"], header
        assert rows, header
        for row in rows:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[0]), row
            assert row[1], row



# ------------------------------------------------------------------------------- API reference
REFERENCED = {"rllm.integrations.strands": ["RLLMModel", "StrandsAgent", "NonStreamingOpenAIModel"],
              "rllm.workflows": ["AgentWorkflowEngine", "StrandsWorkflow"]}


@pytest.mark.parametrize("module", sorted(REFERENCED))
def test_the_api_reference_shows_the_public_names_with_their_docstrings(module: str) -> None:
    """mkdocstrings renders a package's ``__all__``; the names a user starts from must be there, documented."""
    pages = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "reference").glob("*.md"))
    assert re.search(rf"^::: {re.escape(module)}$", pages, re.MULTILINE), f"no API reference page for {module}"
    package = importlib.import_module(module)
    for name in REFERENCED[module]:
        assert name in package.__all__, f"{module}.{name} is not in __all__, so the reference leaves it out"
        assert (getattr(package, name).__doc__ or "").strip(), f"{module}.{name} has no docstring"
