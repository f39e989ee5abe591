"""Answer extraction: the edge cases the benchmarks' own evaluators handle, and the ones they get wrong."""

from __future__ import annotations

import pytest

from llava_normaligned.evaluation.extraction import extract_choice, extract_yes_no, normalize_answer, ocr_match

OPTIONS = {"A": "red", "B": "green", "C": "dark blue", "D": "blue"}


@pytest.mark.parametrize(
    "prediction, expected",
    [
        ("B", "B"),
        ("b", "B"),
        ("B.", "B"),
        ("(C)", "C"),
        ("C)", "C"),
        ("**D**", "D"),
        ("D. blue", "D"),
        ("(A) red", "A"),
        ("The answer is (B).", "B"),
        ("The answer is B because the square is green.", "B"),
        ("Answer: C", "C"),
        ("answer: (b).", "B"),
        ("Option D", "D"),
        ("green", "B"),  # the option's text instead of its letter
        ("Green.", "B"),
        ("It is dark blue.", "C"),  # "blue" is inside "dark blue": the longer option wins
        ("", None),
        ("   ", None),
        (None, None),
        ("E", None),  # not one of the offered letters
        ("I cannot tell.", None),
        ("A square is drawn on the canvas", None),  # the article "A", not option A
        ("the answer is a square", None),  # a lower-case article after "answer is" states no letter
        # a stated answer beats a mentioned option, and the last one stated counts
        ("Option A is wrong; the answer is B.", "B"),
        ("The answer is A. No, wait: the answer is C.", "C"),
        ("Looking at option D, the correct option is B", "B"),
        ("Option A is not correct.", None),  # a rejected option is no pick
        ("A is wrong.", None),
        ("Option C or option D", None),  # two options mentioned: no pick
        # an option's text after a negation is not picked
        ("It is not red", None),
        ("It is not red, it is green.", "B"),
        ("Not the red one but the green one", "B"),
        ("The colour is bored", None),  # whole words only: "red" is not in "bored"
    ],
)
def test_extract_choice(prediction, expected):
    assert extract_choice(prediction, "ABCD", OPTIONS) == expected


def test_extract_choice_without_option_texts_reads_letters_only():
    # MMStar writes its options inside the question: no option texts to match
    assert extract_choice("green", "ABCD", None) is None
    assert extract_choice("C", "ABCD", None) == "C"


def test_extract_choice_two_matching_texts_is_ambiguous():
    assert extract_choice("red or green", "ABCD", OPTIONS) is None


@pytest.mark.parametrize(
    "prediction, expected",
    [
        ("Yes.", "yes"),
        ("yes", "yes"),
        ("YES, there is a dog.", "yes"),
        ("no", "no"),
        ("No.", "no"),
        ("There is not a dog in the image.", "no"),
        ("No, there is no dog. Yes, a cat.", "no"),  # the first sentence decides
        ("There is a dog.", None),  # neither: unparsed, not "yes" as LLaVA's script would have it
        ("", None),
        (None, None),
    ],
)
def test_extract_yes_no(prediction, expected):
    assert extract_yes_no(prediction) == expected


def test_normalize_answer():
    assert normalize_answer("  Top  Left. ") == "top left"
    assert normalize_answer("Two") == normalize_answer("two!")
    assert normalize_answer(None) == ""


@pytest.mark.parametrize(
    "prediction, answers, dataset, expected",
    [
        ("The word is HELLO world", ["Hello"], "IIIT5K", True),
        ("Helo", ["Hello"], "IIIT5K", False),
        ("It was on 5 May 2020", ["May 5", "5 May"], "docVQA", True),
        ("x^{2}", ["x ^ { 2 }"], "HME100k", True),  # spaces do not count in formulas
        ("X^{2}", ["x ^ { 2 }"], "HME100k", False),  # case does
        ("", ["Hello"], "IIIT5K", False),
        (None, ["Hello"], "IIIT5K", False),
        ("anything", ["  "], "IIIT5K", False),  # a blank accepted answer matches nothing
    ],
)
def test_ocr_match(prediction, answers, dataset, expected):
    assert ocr_match(prediction, answers, dataset) is expected
