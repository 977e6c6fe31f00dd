"""HotpotQA tasks and paragraphs, read from files in the original HotpotQA schema.

The shipped sample (100 dev questions) serves offline; ``scripts/prepare_hotpotqa.py`` writes the
full splits in the same schema, so one loader reads both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHIPPED_HOTPOTQA = Path(__file__).parent / "hotpotqa" / "dev_sample100.jsonl"


def _rows(path: str | Path) -> Iterator[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"HotpotQA file not found: {path} (run scripts/prepare_hotpotqa.py, "
                                "or omit the path to use the shipped sample)")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON object: {e}") from e


def load_hotpotqa(path: str | Path | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Tasks as ``{id, question, answer, type, level, supporting_facts}`` in file order.

    ``path`` defaults to the shipped sample; ``limit`` keeps the first N tasks.
    """
    tasks: list[dict[str, Any]] = []
    for row in _rows(path or SHIPPED_HOTPOTQA):
        if limit is not None and len(tasks) >= limit:
            break
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            raise ValueError(f"HotpotQA row {row.get('_id', len(tasks))} lacks {missing}")
        tasks.append({
            "id": str(row.get("_id", row.get("id", len(tasks)))),
            "question": row["question"],
            "answer": row["answer"],
            "type": row.get("type"),
            "level": row.get("level"),
            "supporting_facts": row.get("supporting_facts", []),
        })
    return tasks


def hotpotqa_paragraphs(path: str | Path | None = None) -> list[dict[str, str]]:
    """Distinct context paragraphs as ``{id, title, text}``, in first-seen order (the demo corpus)."""
    seen: dict[tuple[str, str], None] = {}
    out: list[dict[str, str]] = []
    for row in _rows(path or SHIPPED_HOTPOTQA):
        for title, sentences in row.get("context", []):
            text = "".join(sentences).strip()
            if (title, text) in seen:
                continue
            seen[(title, text)] = None
            out.append({"id": str(len(out)), "title": title, "text": text})
    return out


def hf_to_hotpotqa(row: dict[str, Any]) -> dict[str, Any]:
    """A ``hotpotqa/hotpot_qa`` (datasets) row in the original HotpotQA JSON schema.

    The Hugging Face copy stores ``supporting_facts`` and ``context`` as columns of lists
    (``{"title": [...], "sent_id": [...]}``); the original files, which ``load_hotpotqa`` reads,
    use ``[[title, sent_id], ...]`` and ``[[title, [sentence, ...]], ...]``.
    """
    facts = row.get("supporting_facts") or {"title": [], "sent_id": []}
    context = row.get("context") or {"title": [], "sentences": []}
    return {
        "_id": str(row["id"]),
        "question": row["question"],
        "answer": row["answer"],
        "type": row.get("type"),
        "level": row.get("level"),
        "supporting_facts": [[title, int(sent)] for title, sent in zip(facts["title"], facts["sent_id"], strict=True)],
        "context": [[title, list(sentences)]
                    for title, sentences in zip(context["title"], context["sentences"], strict=True)],
    }
