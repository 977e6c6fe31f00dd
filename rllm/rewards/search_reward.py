r"""HotpotQA-style scoring of a boxed answer: SQuAD normalisation, exact match and token F1.

The answer is read from the last ``\boxed{...}`` of the final message (nested braces are
balanced, ``\text{}``-style wrappers removed); text inside ``<think>`` blocks never counts. Exact
match earns 1.0. Token F1 is reported always and earned as reward only with ``partial_credit``,
which is off by default because a reward for overlapping words can be gamed by listing many.
As in the official HotpotQA evaluation, a yes/no answer scores F1 0 against anything but itself.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from rllm.rewards.base import RewardOutput

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|emph)\s*\{([^{}]*)\}")
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, ground_truth: str) -> bool:
    """Whether the two are equal after normalisation."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 after normalisation; a yes/no/noanswer mismatch is 0 (HotpotQA's rule)."""
    pred, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _balanced(text: str, open_index: int) -> str | None:
    """The text inside the brace group opening at ``open_index``, or ``None`` if it never closes."""
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
    return None


def _unwrap(content: str) -> str:
    r"""Remove ``\text{...}``-style wrappers (innermost first) so ``\boxed{\text{Paris}}`` reads ``Paris``."""
    previous = None
    while previous != content:
        previous, content = content, _WRAPPERS.sub(r"\1", content)
    return content.strip()


def strip_thinking(text: str) -> str:
    """Drop ``<think>`` blocks, and everything before a dangling ``</think>`` (a prefilled opening)."""
    text = _THINK_BLOCK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def extract_boxed(text: str | None) -> str | None:
    r"""The content of the last complete ``\boxed{...}`` (or ``\fbox{...}``), or ``None`` if there is none."""
    if not text:
        return None
    found: tuple[int, str] | None = None
    for command in _BOX_COMMANDS:
        start = text.find(command)
        while start != -1:
            brace = start + len(command)
            while brace < len(text) and text[brace] == " ":
                brace += 1
            if brace < len(text) and text[brace] == "{":
                content = _balanced(text, brace)
                if content is not None and (found is None or start > found[0]):
                    found = (start, content)
            start = text.find(command, start + 1)
    return None if found is None else _unwrap(found[1])


def ground_truths(task: dict[str, Any]) -> list[str]:
    """The accepted answers of a task: ``task["answer"]`` as a string or a list of aliases."""
    answer = task.get("answer", task.get("ground_truth"))
    if answer is None:
        raise KeyError(f"task {task.get('id', '?')} has no 'answer' to score against")
    answers = [answer] if isinstance(answer, str) else [str(a) for a in answer]
    if not answers:
        raise ValueError(f"task {task.get('id', '?')} has an empty answer list")
    return answers


class RewardSearchFn:
    r"""Scores a search agent's final answer against HotpotQA-style ground truths.

    Args:
        partial_credit: Reward the best token F1 when there is no exact match (off: 0).
        fallback_to_response: With no ``\boxed{}`` in the answer, score the whole final message
            instead of giving 0. Off by default: the prompt asks for a box, and scoring free text
            rewards answers that merely contain the right words.
    """

    def __init__(self, partial_credit: bool = False, fallback_to_response: bool = False) -> None:
        self.partial_credit = partial_credit
        self.fallback_to_response = fallback_to_response

    def __call__(self, task: dict[str, Any], response: str | None) -> RewardOutput:
        """Score ``response`` (the final answer text) for ``task``."""
        answers = ground_truths(task)
        text = strip_thinking(response or "")
        extracted = extract_boxed(text)
        metadata: dict[str, Any] = {"ground_truths": answers, "extracted": extracted, "source": "boxed"}
        if extracted is None:
            if not self.fallback_to_response or not text.strip():
                metadata.update(reason="no \\boxed{} answer in the response", em=False, f1=0.0)
                return RewardOutput(reward=0.0, is_correct=False, metadata=metadata)
            extracted = text.strip()
            metadata.update(extracted=extracted, source="response")
        em = any(exact_match(extracted, gold) for gold in answers)
        f1 = max(f1_score(extracted, gold) for gold in answers)
        metadata.update(em=em, f1=f1)
        reward = 1.0 if em else (f1 if self.partial_credit else 0.0)
        return RewardOutput(reward=reward, is_correct=em, metadata=metadata)
