"""RewardSearchFn on hand-made answers: box extraction, normalisation, aliases, partial credit."""

from __future__ import annotations

import pytest

from rllm.rewards import RewardOutput, RewardSearchFn, extract_boxed, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{Paris}.", "Paris"),
        ("\\boxed{f(x) = {a, {b}}} done", "f(x) = {a, {b}}"),
        ("first \\boxed{London} then, on reflection, \\boxed{Paris}", "Paris"),
        ("\\boxed{\\text{New York City}}", "New York City"),
        ("\\boxed {spaced}", "spaced"),
        ("\\fbox{framed}", "framed"),
        ("an unclosed \\boxed{Paris", None),
        ("\\boxed{Rome} and a broken \\boxed{Paris", "Rome"),
        ("no box at all", None),
        ("", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert normalize_answer("  The Beatles!  ") == "beatles"
    assert normalize_answer("A Tale of Two Cities.") == "tale of two cities"
    assert normalize_answer("U.S.A.") == "usa"


@pytest.mark.parametrize(
    ("response", "answer", "correct"),
    [
        ("\\boxed{the Eiffel Tower.}", "Eiffel Tower", True),
        ("\\boxed{EIFFEL tower}", "The Eiffel Tower", True),
        ("\\boxed{Yes}", "yes", True),
        ("\\boxed{no}", "yes", False),
        ("\\boxed{Eiffel}", "Eiffel Tower", False),
        ("\\boxed{NYC}", ["New York City", "NYC"], True),
        ("\\boxed{Big Apple}", ["New York City", "NYC"], False),
    ],
)
def test_exact_match_decides_correctness(response: str, answer: str | list[str], correct: bool) -> None:
    out = RewardSearchFn()({"answer": answer}, response)
    assert isinstance(out, RewardOutput)
    assert out.is_correct is correct
    assert out.reward == (1.0 if correct else 0.0)


def test_yes_no_mismatch_has_zero_f1_even_with_partial_credit() -> None:
    assert f1_score("no", "yes") == 0.0
    assert f1_score("yes it is", "yes") == 0.0
    out = RewardSearchFn(partial_credit=True)({"answer": "yes"}, "\\boxed{yes it is}")
    assert out.reward == 0.0 and not out.is_correct


def test_partial_credit_is_off_by_default_and_configurable() -> None:
    task = {"answer": "Eiffel Tower"}
    strict = RewardSearchFn()(task, "\\boxed{Eiffel}")
    assert strict.reward == 0.0
    assert strict.metadata["f1"] == pytest.approx(2 / 3)
    lenient = RewardSearchFn(partial_credit=True)(task, "\\boxed{Eiffel}")
    assert lenient.reward == pytest.approx(2 / 3)
    assert not lenient.is_correct  # partial credit never makes an answer correct
    assert RewardSearchFn(partial_credit=True)(task, "\\boxed{the Eiffel Tower}").reward == 1.0


def test_partial_credit_takes_the_best_alias() -> None:
    out = RewardSearchFn(partial_credit=True)({"answer": ["New York City", "Manhattan island"]}, "\\boxed{Manhattan}")
    assert out.reward == pytest.approx(2 / 3)


def test_no_box_scores_zero_and_says_why() -> None:
    out = RewardSearchFn()({"answer": "Paris"}, "The answer is Paris.")
    assert out.reward == 0.0 and not out.is_correct
    assert out.metadata["extracted"] is None
    assert "no \\boxed{}" in out.metadata["reason"]


def test_fallback_scores_the_whole_message_when_asked() -> None:
    out = RewardSearchFn(fallback_to_response=True)({"answer": "Paris"}, "  Paris. ")
    assert out.is_correct and out.metadata["source"] == "response"
    # a box still wins over the surrounding text
    boxed = RewardSearchFn(fallback_to_response=True)({"answer": "Paris"}, "Paris? No: \\boxed{Lyon}")
    assert not boxed.is_correct and boxed.metadata["extracted"] == "Lyon"


def test_boxes_inside_thinking_do_not_count() -> None:
    fn = RewardSearchFn()
    assert not fn({"answer": "Paris"}, "<think>maybe \\boxed{Paris}</think>I don't know.").is_correct
    assert fn({"answer": "Paris"}, "<think>\\boxed{Lyon}?</think>\\boxed{Paris}").is_correct
    # a prefilled <think> leaves only the closing tag in the text
    assert not fn({"answer": "Paris"}, "hmm \\boxed{Paris}</think>\\boxed{Lyon}").is_correct


def test_missing_answer_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no 'answer'"):
        RewardSearchFn()({"id": "t1", "question": "?"}, "\\boxed{x}")
