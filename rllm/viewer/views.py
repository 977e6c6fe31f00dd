"""What the pages show, computed from the sources: curves as inline SVG, an episode's parts, a listing's page.

Templates only lay these out; everything a page shows of the data is decided here, so it is testable
without a browser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rllm.records import content_text, conversation, task_text
from rllm.viewer.sources import REWARD_KEYS, Summary

PAGE_SIZE = 50
"""Episodes a listing page shows."""
GUARD_PREFIX = "rllm/guard/"
"""The training guards' metrics."""
CURVE_KEYS = (*REWARD_KEYS, "eval_reward", "rllm/guard/tool_calls_per_episode", "tool_calls")
"""Curves drawn first, when the run has them; validation scores (``val-core/...``) follow, then the guards'."""
SORTS = ("index", "task", "reward", "advantage", "ending")


@dataclass
class Curve:
    """One metric by step, drawn as an SVG polyline."""

    key: str
    points: list[tuple[int, float]]
    width: int = 320
    height: int = 90

    @property
    def last(self) -> float:
        return self.points[-1][1]

    @property
    def low(self) -> float:
        return min(v for _, v in self.points)

    @property
    def high(self) -> float:
        return max(v for _, v in self.points)

    @property
    def polyline(self) -> str:
        """The points in the SVG's coordinates (steps left to right, values bottom to top)."""
        steps = [s for s, _ in self.points]
        first, span = min(steps), (max(steps) - min(steps)) or 1
        low, rise = self.low, (self.high - self.low) or 1.0
        pad = 6
        return " ".join(f"{pad + (s - first) / span * (self.width - 2 * pad):.1f},"
                        f"{self.height - pad - (v - low) / rise * (self.height - 2 * pad):.1f}" for s, v in self.points)


def curves(metrics: list[dict[str, Any]]) -> list[Curve]:
    """The run's curves: reward, validation, tool calls, then every guard's metric, each with a finite value."""
    keys: list[str] = []
    for row in metrics:
        for key, value in row.items():
            if key not in keys and isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
                keys.append(key)
    chosen = [k for k in CURVE_KEYS if k in keys]
    chosen += [k for k in keys if k.startswith("val-core/") and k not in chosen]
    chosen += sorted(k for k in keys if k.startswith(GUARD_PREFIX) and k not in chosen)
    drawn = []
    for key in chosen:
        points = [(int(row["step"]), float(row[key])) for row in metrics
                  if isinstance(row.get(key), int | float) and math.isfinite(float(row[key]))]
        if points:
            drawn.append(Curve(key, points))
    return drawn


def guard_values(metrics: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The guards' values at the last step that logged them."""
    for row in reversed(metrics):
        values = sorted((k, v) for k, v in row.items() if k.startswith(GUARD_PREFIX))
        if values:
            return values
    return []


@dataclass
class Page:
    """One page of a listing, filtered by task text and sorted."""

    rows: list[Summary]
    total: int
    page: int
    pages: int
    query: str
    sort: str
    order: str


def first_page(count: int) -> Page:
    """The first page of a listing of ``count`` lines in file order (nothing read but the offsets)."""
    return Page(rows=[], total=count, page=1, pages=max(1, -(-count // PAGE_SIZE)), query="", sort="index",
                order="asc")


def listing_page(summaries: list[Summary], *, page: int, query: str, sort: str, order: str) -> Page:
    """The page ``page`` (from 1) of the summaries whose task contains ``query``, sorted by ``sort``."""
    sort = sort if sort in SORTS else "index"
    found = [s for s in summaries if query.lower() in s.task.lower()] if query else list(summaries)
    missing = float("-inf") if order == "desc" else float("inf")

    def key(summary: Summary) -> Any:
        value = getattr(summary, sort)
        if sort in ("reward", "advantage"):
            return missing if value is None else value
        return value.lower() if isinstance(value, str) else value

    found.sort(key=key, reverse=order == "desc")
    pages = max(1, -(-len(found) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    return Page(rows=found[(page - 1) * PAGE_SIZE: page * PAGE_SIZE], total=len(found), page=page, pages=pages,
                query=query, sort=sort, order="desc" if order == "desc" else "asc")


@dataclass
class Token:
    """One token as the page shows it."""

    text: str
    css: str
    title: str


@dataclass
class Sample:
    """A sample's tokens: its prompt (context) and its response, the trained tokens marked."""

    index: int
    agent: str
    prompt: list[Token]
    response: list[Token]
    trained: int
    advantage: float | None


@dataclass
class Entry:
    """One entry of a conversation (``rllm.records.conversation``), with its text worked out."""

    kind: str
    role: str = ""
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str = ""
    request: str = ""


@dataclass
class Thread:
    """A trajectory: a team node or an agent, its conversation in order."""

    name: str
    entries: list[Entry]


@dataclass
class EpisodeView:
    """Everything an episode page shows."""

    task: str
    reward: float | None
    advantage: float | None
    ending: str
    final_answer: str
    threads: list[Thread]
    samples: list[Sample]
    extra: dict[str, Any]


def _entry(item: dict[str, Any]) -> Entry:
    kind = item.get("kind", "message")
    if kind == "message":
        message = item.get("message") or {}
        calls = [{"name": (c.get("function") or c).get("name"), "arguments": (c.get("function") or c).get("arguments")}
                 for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        return Entry(kind="message", role=str(message.get("role", "")), text=content_text(message.get("content")),
                     tool_calls=calls, tool_call_id=str(message.get("tool_call_id") or ""))
    if kind in ("output", "side_call"):
        output = item if kind == "output" else item.get("output") or {}
        request = "\n".join(content_text(m.get("content")) for m in item.get("request") or [] if isinstance(m, dict))
        return Entry(kind=kind, role="assistant", text=str(output.get("text") or ""),
                     reasoning=str(output.get("reasoning") or ""), tool_calls=list(output.get("tool_calls") or []),
                     request=request)
    return Entry(kind=kind, text=f"history rewritten: the next call was sent {item.get('messages', '?')} messages")


def _tokens(ids: list[int], pieces: list[str] | None, mask: list[int] | None, logprobs: list[float] | None,
            advantage: float | None, css_context: str) -> list[Token]:
    tokens = []
    for i, token_id in enumerate(ids):
        text = pieces[i] if pieces is not None and i < len(pieces) else f"[{token_id}]"
        if mask is not None and i < len(mask) and mask[i]:
            logprob = logprobs[i] if logprobs and i < len(logprobs) else None
            title = f"id {token_id} · trained · logprob {logprob:.4f}" if logprob is not None else \
                f"id {token_id} · trained"
            if advantage is not None:
                title += f" · advantage {advantage:.4f}"
            tokens.append(Token(text, "tok tok-trained", title))
        else:
            tokens.append(Token(text, f"tok {css_context}", f"id {token_id} · not trained"))
    return tokens


def _record_samples(record: dict[str, Any]) -> list[Sample]:
    samples = []
    for n, sample in enumerate(record.get("samples") or []):
        advantage = sample.get("advantage")
        prompt = _tokens(sample.get("prompt_ids") or [], sample.get("prompt_tokens"), None, None, None, "tok-prompt")
        response = _tokens(sample.get("response_ids") or [], sample.get("response_tokens"), sample.get("loss_mask"),
                           sample.get("logprobs"), advantage, "tok-masked")
        samples.append(Sample(index=int(sample.get("index", n)), agent=str(sample.get("agent") or ""), prompt=prompt,
                              response=response, trained=sum(1 for m in sample.get("loss_mask") or [] if m),
                              advantage=advantage))
    return samples


def _episode_samples(episode: dict[str, Any]) -> list[Sample]:
    """An ``Episode``'s token traces (token-in/token-out engines), ids only: the file carries no token text."""
    samples = []
    for n, trajectory in enumerate(episode.get("trajectories") or []):
        trace = trajectory.get("token_trace") or {}
        ids = trace.get("token_ids") or []
        if ids:
            mask = trace.get("loss_mask") or []
            tokens = _tokens(ids, None, mask, trace.get("logprobs"), None, "tok-masked")
            samples.append(Sample(index=n, agent=str(trajectory.get("name", "")), prompt=[], response=tokens,
                                  trained=sum(1 for m in mask if m), advantage=None))
    return samples


def episode_view(item: dict[str, Any]) -> EpisodeView:
    """A rollout record (training) or an ``Episode``'s JSON (evaluation) as its page shows it."""
    is_record = "samples" in item
    threads = []
    for trajectory in item.get("trajectories") or []:
        entries = trajectory.get("conversation") if is_record else conversation(trajectory.get("steps") or [])
        threads.append(Thread(name=str(trajectory.get("name") or "agent"), entries=[_entry(e) for e in entries or []]))
    final = item.get("final_answer")
    if final is None and not is_record:
        outputs = [e for t in threads for e in t.entries if e.kind == "output"]
        final = outputs[-1].text if outputs else ""
    text = item.get("task_text") if isinstance(item.get("task_text"), str) else task_text(item.get("task"))
    shown = ("rollout", "group", "step", "id", "is_correct", "truncated", "num_tool_calls")
    extra: dict[str, Any] = {k: item[k] for k in shown if k in item}
    if isinstance(item.get("info"), dict):
        extra.update({k: v for k, v in item["info"].items() if isinstance(v, str | int | float | bool)})
    reward, advantage = item.get("reward"), item.get("advantage")
    return EpisodeView(task=str(text), reward=float(reward) if isinstance(reward, int | float) else None,
                       advantage=float(advantage) if isinstance(advantage, int | float) else None,
                       ending=str(item.get("termination_reason") or ""), final_answer=str(final or ""),
                       threads=threads, samples=_record_samples(item) if is_record else _episode_samples(item),
                       extra=extra)
