r"""GAIA scoring: the benchmark's official answer comparison and a reward function around it.

``gaia_score`` reimplements the rules of ``question_scorer`` in the GAIA leaderboard space
(``gaia-benchmark/leaderboard``, ``scorer.py``), so accuracies here are comparable with the
leaderboard's:

* a ground truth that parses as a float: remove ``$``, ``%`` and ``,`` from the answer and compare
  the two as floats (an answer that still does not parse is wrong);
* a ground truth containing ``,`` or ``;``: split both strings on those characters; the lists must
  have the same length, and each element is compared with the number rule when the ground-truth
  element parses as a float, otherwise as a string with whitespace removed and lower-cased
  (punctuation is kept inside list elements, as the official scorer does);
* any other ground truth: compare as strings after removing all whitespace and punctuation and
  lower-casing.

The agent is asked (as in GAIA's own prompt) to end with ``FINAL ANSWER: ...``; the answer is
taken from the last such line, else from the last ``\boxed{}``, else the whole final message.
"""

from __future__ import annotations

import logging
import re
import string
from typing import Any

from rllm.rewards.base import RewardOutput
from rllm.rewards.search_reward import extract_boxed

logger = logging.getLogger(__name__)

_NUMBER_NOISE = str.maketrans("", "", "$%,")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_LIST_SEPARATORS = re.compile(r"[,;]")
_WHITESPACE = re.compile(r"\s")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FINAL_ANSWER = re.compile(r"[*_#\s]*final[ \t]+answer[*_ \t]*:[*_ \t]*(?P<rest>[^\n]*)", re.IGNORECASE)
_DECORATION = "*_`\"' \t"

# The answer GAIA's test split gives for its hidden answers.
_HIDDEN_ANSWER = "?"


def _as_float(text: str) -> float | None:
    """``float(text)`` or ``None`` when the text is not a number (Python's float syntax)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _number_matches(model_answer: str, truth: float) -> bool:
    value = _as_float(model_answer.translate(_NUMBER_NOISE))
    return value is not None and value == truth


def _normalize_str(text: str, *, remove_punctuation: bool = True) -> str:
    text = _WHITESPACE.sub("", text).lower()
    return text.translate(_PUNCTUATION) if remove_punctuation else text


def gaia_score(model_answer: str | None, ground_truth: str) -> bool:
    """Whether ``model_answer`` is correct for ``ground_truth`` under GAIA's official rules."""
    answer = "None" if model_answer is None else str(model_answer)
    truth = str(ground_truth)
    truth_number = _as_float(truth)
    if truth_number is not None:
        return _number_matches(answer, truth_number)
    if "," in truth or ";" in truth:
        truth_items = _LIST_SEPARATORS.split(truth)
        answer_items = _LIST_SEPARATORS.split(answer)
        if len(truth_items) != len(answer_items):
            return False
        for answer_item, truth_item in zip(answer_items, truth_items, strict=True):
            item_number = _as_float(truth_item)
            if item_number is not None:
                if not _number_matches(answer_item, item_number):
                    return False
            elif _normalize_str(answer_item, remove_punctuation=False) != _normalize_str(
                truth_item, remove_punctuation=False
            ):
                return False
        return True
    return _normalize_str(answer) == _normalize_str(truth)


def extract_final_answer(response: str) -> tuple[str, str]:
    r"""The answer in an agent's final message and how it was found.

    Returns ``(answer, method)`` with method ``"final_answer"`` (the last ``FINAL ANSWER:`` line;
    when that line is empty, the next non-empty line), ``"boxed"`` (the last ``\boxed{}``) or
    ``"raw"`` (the whole message, stripped). Reasoning in ``<think>`` tags is ignored.
    """
    text = _THINK.sub("", response or "")
    matches = list(_FINAL_ANSWER.finditer(text))
    if matches:
        last = matches[-1]
        answer = last.group("rest").strip(_DECORATION)
        if not answer:
            following = [line.strip(_DECORATION) for line in text[last.end():].splitlines()]
            answer = next((line for line in following if line), "")
        boxed = extract_boxed(answer)
        return (boxed if boxed is not None else answer).strip(), "final_answer"
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    return text.strip(), "raw"


def gaia_ground_truth(task: dict[str, Any]) -> str | None:
    """The task's ground truth (``final_answer`` or ``answer``), ``None`` when hidden or absent."""
    truth = task.get("final_answer", task.get("answer"))
    if truth is None:
        return None
    truth = str(truth)
    return None if truth.strip() in ("", _HIDDEN_ANSWER) else truth


class RewardGaiaFn:
    """Reward 1.0 when the agent's final answer is correct under GAIA's rules, else 0.0.

    Called as ``reward_fn(task, response)`` with ``response`` the agent's final message. Tasks
    without a ground truth (GAIA's test split hides it as ``"?"``) get 0.0 with
    ``metadata["scored"] = False`` so reports can leave them out of accuracy.
    """

    def __call__(self, task: dict[str, Any], response: str) -> RewardOutput:
        answer, method = extract_final_answer(response)
        truth = gaia_ground_truth(task)
        metadata: dict[str, Any] = {
            "extracted_answer": answer,
            "extraction": method,
            "ground_truth": truth,
            "scored": truth is not None,
        }
        if truth is None:
            return RewardOutput(reward=0.0, is_correct=False, metadata=metadata)
        correct = gaia_score(answer, truth)
        return RewardOutput(reward=1.0 if correct else 0.0, is_correct=correct, metadata=metadata)
