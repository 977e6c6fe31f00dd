"""What the viewer serves, read lazily: a run directory or an episodes JSONL.

A JSONL (a step's rollout records, ``rollouts/step_NNNNNN.jsonl``, or ``AgentWorkflowEngine``'s episodes) is
opened by indexing its line offsets (one streaming pass that keeps only the offsets; a file that grew is
indexed from where the last pass stopped), and a page reads only its own lines. Sorting or searching a
listing reads every line once into a small summary (task text, reward, advantage, ending), kept until the
file changes.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm.records import ROLLOUTS_DIR, task_text

METRICS_FILES = ("metrics.jsonl", "verl_metrics.jsonl")
"""A run's metrics: verl's file logger (``{"step": N, "data": {...}}``) or the quickstart's (``{"step": N, ...}``)."""
REWARD_KEYS = ("critic/score/mean", "reward")
"""A step's mean reward in ``metrics.jsonl`` (verl's, the quickstart's)."""
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
_CHUNK = 1 << 20


class NotServable(ValueError):
    """A path that is neither a run directory nor an episodes JSONL."""


@dataclass
class Summary:
    """What a listing shows of one line: its index in the file, task text, reward, advantage and ending."""

    index: int
    task: str
    reward: float | None
    advantage: float | None
    ending: str


def summarize(index: int, item: dict[str, Any]) -> Summary:
    """The summary of a rollout record or an ``Episode``'s JSON."""
    text = item.get("task_text") if isinstance(item.get("task_text"), str) else task_text(item.get("task"))
    reward, advantage = item.get("reward"), item.get("advantage")
    return Summary(index=index, task=str(text), reward=float(reward) if isinstance(reward, int | float) else None,
                   advantage=float(advantage) if isinstance(advantage, int | float) else None,
                   ending=str(item.get("termination_reason") or ""))


class JsonlIndex:
    """A JSONL file read by line: offsets indexed lazily, a line parsed only when asked for.

    Args:
        path: The file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: list[int] = []
        self._scanned = 0  # bytes indexed so far (up to the last complete line)
        self._summaries: list[Summary] = []
        self._lock = threading.Lock()

    def _index(self) -> list[int]:
        with self._lock:
            size = self.path.stat().st_size
            if size < self._scanned:  # rewritten: start again
                self._offsets, self._scanned, self._summaries = [], 0, []
            if size > self._scanned:
                with self.path.open("rb") as file:
                    file.seek(self._scanned)
                    position, start = self._scanned, self._scanned
                    while chunk := file.read(_CHUNK):
                        cut = 0
                        while (newline := chunk.find(b"\n", cut)) >= 0:
                            end = position + newline
                            if end > start:  # not an empty line
                                self._offsets.append(start)
                            start, cut = end + 1, newline + 1
                        position += len(chunk)
                    self._scanned = start  # a last line without its newline is read on the next pass
            return self._offsets

    def __len__(self) -> int:
        return len(self._index())

    def read(self, index: int) -> dict[str, Any]:
        """Line ``index`` parsed (``IndexError`` beyond the file, ``ValueError`` for a line that is not an object)."""
        offsets = self._index()
        if not 0 <= index < len(offsets):
            raise IndexError(index)
        with self.path.open("rb") as file:
            file.seek(offsets[index])
            line = file.readline()
        item = json.loads(line)
        if not isinstance(item, dict):
            raise ValueError(f"{self.path} line {index + 1} is not a JSON object")
        return item

    def summaries(self) -> list[Summary]:
        """Every line's summary, in file order (read once; lines added since are read on the next call)."""
        offsets = self._index()
        with self._lock:
            if len(self._summaries) < len(offsets):
                with self.path.open("rb") as file:
                    file.seek(offsets[len(self._summaries)])
                    for index in range(len(self._summaries), len(offsets)):
                        line = file.readline()
                        while not line.strip():
                            line = file.readline()
                        try:
                            item = json.loads(line)
                        except ValueError:
                            item = {"termination_reason": "unreadable line"}
                        self._summaries.append(summarize(index, item if isinstance(item, dict) else {}))
            return list(self._summaries)


def looks_like_episodes(path: Path) -> bool:
    """Whether ``path`` is a JSONL whose first line is an episode or a rollout record."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            first = file.readline(16 << 20)
        item = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(item, dict) and ("trajectories" in item or "samples" in item)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """A metrics JSONL as ``{"step": N, **values}`` rows (verl's ``data`` unpacked), unreadable lines skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("step") is not None:
            values = entry["data"] if isinstance(entry.get("data"), dict) else entry
            rows.append({**values, "step": entry["step"]})
    return rows


@dataclass
class Listing:
    """A list of episodes the viewer pages through: a step's rollouts or an evaluation's episodes.

    Attributes:
        kind: ``step`` or ``eval``.
        key: The step number, or the evaluation file's name.
        index: Its lines.
    """

    kind: str
    key: str
    index: JsonlIndex

    @property
    def title(self) -> str:
        return f"step {int(self.key)}" if self.kind == "step" else f"evaluation {self.key}"

    @property
    def url(self) -> str:
        return f"/{self.kind}/{self.key}"


@dataclass
class Source:
    """What ``PATH`` is: a run directory (steps, metrics, evaluations) or one episodes file.

    Attributes:
        path: The path given.
        is_run: A run directory (else an episodes file).
        evaluations: Episodes files, by name (the run's ``*.jsonl`` of episodes, or the file given).
    """

    path: Path
    is_run: bool
    evaluations: dict[str, Listing] = field(default_factory=dict)
    _steps: dict[int, Listing] = field(default_factory=dict)

    def steps(self) -> dict[int, Listing]:
        """The run's recorded steps, by number (the folder is read again: a running run adds steps)."""
        folders = [self.path / ROLLOUTS_DIR, *sorted(self.path.glob(f"*/{ROLLOUTS_DIR}"))]  # the quickstart's
        folder = next((f for f in folders if f.is_dir()), self.path / ROLLOUTS_DIR)  # are in its checkpoints/
        if self.is_run and folder.is_dir():
            for file in folder.iterdir():
                match = _STEP_FILE.match(file.name)
                if match and int(match.group(1)) not in self._steps:
                    self._steps[int(match.group(1))] = Listing("step", str(int(match.group(1))), JsonlIndex(file))
        return dict(sorted(self._steps.items()))

    def metrics(self) -> list[dict[str, Any]]:
        """The run's metrics rows, by step (``metrics.jsonl``, else ``verl_metrics.jsonl``)."""
        for name in METRICS_FILES:
            if (self.path / name).is_file():
                return read_metrics(self.path / name)
        return []

    def listing(self, kind: str, key: str) -> Listing | None:
        """The listing ``/kind/key`` names, or ``None``."""
        if kind == "step":
            try:
                return self.steps().get(int(key))
            except ValueError:
                return None
        return self.evaluations.get(key) if kind == "eval" else None


def step_rewards(metrics: list[dict[str, Any]]) -> dict[int, float]:
    """Each step's mean training reward in the metrics (verl's ``critic/score/mean``, the quickstart's ``reward``)."""
    found: dict[int, float] = {}
    for row in metrics:
        for key in REWARD_KEYS:
            if isinstance(row.get(key), int | float):
                found[int(row["step"])] = float(row[key])
                break
    return found


def mean_reward(listing: Listing) -> float | None:
    """A listing's mean reward from its lines (when the metrics have none)."""
    rewards = [s.reward for s in listing.index.summaries() if s.reward is not None]
    return statistics.fmean(rewards) if rewards else None


def open_source(path: Path) -> Source:
    """``path`` as a ``Source``; ``NotServable`` naming it when it is neither a run directory nor an episodes file."""
    if path.is_dir():
        markers = [*METRICS_FILES, ROLLOUTS_DIR, "learning_curve.png", "summary.json", f"checkpoints/{ROLLOUTS_DIR}"]
        evaluations = {p.name: Listing("eval", p.name, JsonlIndex(p))
                       for p in sorted(path.glob("*.jsonl")) if p.name not in METRICS_FILES and looks_like_episodes(p)}
        if evaluations or any((path / marker).exists() for marker in markers) or any(path.glob("global_step_*")):
            return Source(path=path, is_run=True, evaluations=evaluations)
        raise NotServable(f"{path} is a folder but not a run directory: it has no metrics.jsonl, rollouts/, "
                          "checkpoints (global_step_*) or episodes JSONL")
    if looks_like_episodes(path):
        return Source(path=path, is_run=False, evaluations={path.name: Listing("eval", path.name, JsonlIndex(path))})
    if path.exists():
        raise NotServable(f"{path} is not an episodes JSONL (its first line is not an episode with trajectories) "
                          "nor a run directory")
    raise NotServable(f"{path} does not exist")
