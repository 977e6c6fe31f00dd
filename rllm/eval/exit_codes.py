"""How an evaluation run that stops early ends: one message and one exit status, for every evaluation command.

2: a set-up problem the user must fix (no model, no server); 1: the run stopped itself (the same
error ended several rollouts, or too many failed on infrastructure), what finished is kept;
130: Ctrl-C, what finished is kept and a rerun resumes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from rllm.errors import InfrastructureFailureRateError, SetupError, SystemicFailureError


@dataclass
class RunEnd:
    """Set by ``stopped_runs`` when the run ended early: its exit status, else ``None``."""

    exit_code: int | None = None


@contextlib.contextmanager
def stopped_runs(console: Console, episodes_path: Path, resume_hint: str) -> Iterator[RunEnd]:
    """Turn a run's early end into its message and ``RunEnd.exit_code``; anything else propagates."""
    end = RunEnd()
    try:
        yield end
    except SetupError as error:
        console.print(f"[bold red]error:[/bold red] {error}", highlight=False)
        end.exit_code = 2
    except (SystemicFailureError, InfrastructureFailureRateError) as error:
        console.print(f"[bold red]run stopped:[/bold red] {error}\nfinished episodes are kept in {episodes_path}",
                      highlight=False)
        end.exit_code = 1
    except KeyboardInterrupt:
        console.print(f"interrupted: finished episodes are kept in {episodes_path}; {resume_hint}", highlight=False)
        end.exit_code = 130
