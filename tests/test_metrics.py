"""Tests for transformer_lite.tasks.metrics (chapter 7)."""

import math

import pytest

from transformer_lite.tasks.metrics import (
    bleu,
    chrf,
    errors,
    exact_match_rate,
    scores,
)

REFS = [
    "four hundred and twenty-one",
    "three thousand, one hundred and twelve",
    "ninety-seven",
    "eight hundred thousand and forty-seven",
]


def test_perfect_output_scores_100():
    assert exact_match_rate(REFS, REFS) == 1.0
    assert bleu(REFS, REFS) == pytest.approx(100.0)
    assert chrf(REFS, REFS) == pytest.approx(100.0)
    assert scores(REFS, REFS) == pytest.approx(
        {"exact match": 100.0, "BLEU": 100.0, "chrF": 100.0}
    )


def test_exact_match_counts_whole_strings():
    hyps = [REFS[0], REFS[1] + " ", REFS[2], "eight hundred thousand"]
    assert exact_match_rate(hyps, REFS) == 0.5


def test_one_wrong_word_costs_less_chrf_than_bleu():
    hyps = list(REFS)
    hyps[1] = "three thousand, one hundred and eleven"
    b, c = bleu(hyps, REFS), chrf(hyps, REFS)
    assert 50 < b < 100 and 50 < c < 100
    assert b < c  # chrF gives partial credit at the character level


def test_bleu_brevity_penalty():
    """BLEU = BP * exp(mean log p_n): a correct but short output has
    all its n-grams right and loses only by the brevity penalty."""
    ref = ["one two three four five six seven eight nine ten"]
    short = ["one two three four five six seven eight"]
    expected = 100 * math.exp(1 - 10 / 8)  # BP = e^(1 - r/c), p_n = 1
    assert bleu(short, ref) == pytest.approx(expected, rel=1e-6)


def test_errors_table():
    hyps = [REFS[0], "three thousand", REFS[2], "eight hundred"]
    sources = ["a", "b", "c", "d"]
    rows = errors(sources, hyps, REFS)
    assert rows == [
        {"source": "b", "output": "three thousand", "reference": REFS[1]},
        {"source": "d", "output": "eight hundred", "reference": REFS[3]},
    ]
    assert errors(sources, REFS, REFS) == []


@pytest.mark.parametrize(
    "hyps, refs, match",
    [
        (["a"], ["a", "b"], "as many"),
        ([], [], "at least one"),
        ("a", ["a"], "sequence of str"),
        ([1], ["a"], "sequence of str"),
    ],
)
def test_bad_inputs(hyps, refs, match):
    with pytest.raises(ValueError, match=match):
        exact_match_rate(hyps, refs)
    with pytest.raises(ValueError, match=match):
        bleu(hyps, refs)


def test_errors_needs_one_source_per_reference():
    with pytest.raises(ValueError, match="sources"):
        errors(["a"], REFS, REFS)
