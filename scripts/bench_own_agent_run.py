"""The page "Train your own Strands agent" run as a reader runs it, each block timed: the benchmarks table's row.

    python scripts/bench_own_agent_run.py --out runs/bench-own-agent

Writes the page's first Python block as ``my_agents.py`` in a fresh folder (``--out``, emptied first), then runs
each later block as a script there, in order (the tiny model, the evaluation, ``AgentTrainer(..., cpu=True,
smoke=True).train()`` with its export, the before/after evaluation of the exported model), and prints each
block's wall time, the run's exported model (its files and size) and the before/after table the last block
printed. Exits non-zero when a block fails. The same blocks run in CI (tests/rllm/training/test_agent_trainer_cpu.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "train-your-own-agent.md"


def page_blocks() -> list[str]:
    """The page's Python blocks, in order."""
    tokens = MarkdownIt().parse(PAGE.read_text(encoding="utf-8"))
    return [t.content for t in tokens if t.type == "fence" and t.info.strip() == "python"]


def main(argv: list[str] | None = None) -> int:
    """Run the page's blocks in ``--out``; 0 when every block passed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-own-agent"))
    args = parser.parse_args(argv)
    folder: Path = args.out.resolve()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    module, *scripts = page_blocks()
    (folder / "my_agents.py").write_text(module, encoding="utf-8")
    env = {**os.environ, "OTEL_SDK_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(folder), str(REPO), os.environ.get("PYTHONPATH", "")])}
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {PAGE.relative_to(REPO)} in {folder}")
    for index, code in enumerate(scripts, start=2):
        name = f"block_{index}.py"
        (folder / name).write_text(code, encoding="utf-8")
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, name], cwd=folder, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        (folder / f"{name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        first = code.strip().splitlines()[-1][:60]
        print(f"block {index}: {seconds:6.1f} s  {'ok' if proc.returncode == 0 else 'FAILED'}  ({first})")
        if proc.returncode:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
            return 1
        last = proc.stdout
    model = folder / "runs" / "mine" / "global_step_2" / "actor" / "huggingface"
    weights = sorted(model.glob("*.safetensors"))
    size = sum(path.stat().st_size for path in weights) / 2**20
    print(f"exported model: {model} ({', '.join(p.name for p in weights)}, {size:.1f} MiB; "
          f"{', '.join(sorted(p.name for p in model.iterdir() if not p.name.endswith('.safetensors')))})")
    print("the last block's table:\n" + "\n".join(last.strip().splitlines()[-3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
