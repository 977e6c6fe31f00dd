"""GAIA's official scoring rules and the final-answer extraction around them, on hand-made cases."""

from __future__ import annotations

import pytest

from rllm.rewards.gaia_reward import RewardGaiaFn, extract_final_answer, gaia_score


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        # number rule: $, % and , are stripped from the answer, then compared as floats
        ("$1,250", "1250", True),
        ("1,250.00", "1250", True),
        ("17%", "17", True),
        ("0.170", "0.17", True),
        (" 42 ", "42", True),
        ("1250 dollars", "1250", False),  # still not a number after stripping: wrong
        ("about 42", "42", False),
        ("1251", "1250", False),
        ("1.25e3", "1250", True),
        ("$", "0", False),
        # list rule: split on , and ; with equal lengths, each element by the number or string rule
        ("Ana; Ben; Zoe", "Ana, Ben, Zoe", True),
        ("ana,ben,ZOE", "Ana, Ben, Zoe", True),
        ("Ana, Ben", "Ana, Ben, Zoe", False),
        ("Ana, Ben, Zoe, Max", "Ana, Ben, Zoe", False),
        ("Ben, Ana, Zoe", "Ana, Ben, Zoe", False),  # order matters
        ("3, 4.0, 5", "3, 4, 5", True),
        ("$3, 4%, 5", "3, 4, 5", True),
        ("3, four, 5", "3, 4, 5", False),
        ("apple, 2", "apple, 2", True),
        ("apple., 2", "apple, 2", False),  # list elements keep their punctuation, as in the official scorer
        # string rule: whitespace and punctuation removed, lower-cased
        ("  Saint-Petersburg ", "Saint Petersburg", True),
        ("st. petersburg", "St Petersburg", True),
        ("Paris.", "paris", True),
        ("Paris, France", "Paris", False),  # ground truth has no separator: string rule, extra words are wrong
        ("paris!", "Paris", True),
        ("Pari", "Paris", False),
        # a string ground truth that contains a number is compared as a string
        ("Route 66", "route 66", True),
        ("Route 66.0", "Route 66", False),
        ("66", "Route 66", False),
        ("3 apples", "3 apples", True),
    ],
)
def test_gaia_score_follows_the_official_rules(answer: str, truth: str, expected: bool) -> None:
    assert gaia_score(answer, truth) is expected


def test_a_missing_answer_is_wrong() -> None:
    assert gaia_score(None, "42") is False
    assert gaia_score(None, "none") is True  # the official scorer compares the string "None"
    assert gaia_score("", "Paris") is False


@pytest.mark.parametrize(
    ("response", "answer", "method"),
    [
        ("I looked it up.\nFINAL ANSWER: Paris", "Paris", "final_answer"),
        ("final answer: 42\nmore thoughts\nFINAL ANSWER: 43", "43", "final_answer"),
        ("**FINAL ANSWER:** `1,250`", "1,250", "final_answer"),
        ("FINAL ANSWER:\n\n  Ana, Ben, Zoe\n", "Ana, Ben, Zoe", "final_answer"),
        ("FINAL ANSWER: \\boxed{\\text{7}}", "7", "final_answer"),
        ("<think>FINAL ANSWER: 1</think>So the result is \\boxed{2}.", "2", "boxed"),
        ("The answer is \\boxed{a{b}c} not \\boxed{x}... actually \\boxed{y}", "y", "boxed"),
        ("  Paris  ", "Paris", "raw"),
    ],
)
def test_the_final_answer_is_extracted(response: str, answer: str, method: str) -> None:
    assert extract_final_answer(response) == (answer, method)


def test_reward_reads_final_answer_or_answer_and_reports_how() -> None:
    reward = RewardGaiaFn()
    out = reward({"final_answer": "1250"}, "Adding it up...\nFINAL ANSWER: $1,250")
    assert (out.reward, out.is_correct) == (1.0, True)
    assert out.metadata == {"extracted_answer": "$1,250", "extraction": "final_answer", "ground_truth": "1250",
                            "scored": True}
    wrong = reward({"answer": "Athens"}, "FINAL ANSWER: Olympia")
    assert (wrong.reward, wrong.is_correct) == (0.0, False)


def test_hidden_test_answers_are_not_scored() -> None:
    out = RewardGaiaFn()({"final_answer": "?"}, "FINAL ANSWER: ?")
    assert (out.reward, out.is_correct, out.metadata["scored"]) == (0.0, False, False)
    assert RewardGaiaFn()({"id": "x"}, "FINAL ANSWER: 1").metadata["scored"] is False
