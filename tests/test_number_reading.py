"""Reading number words back (the translator's domain check, chapter 7):
``read_number`` inverts ``number_words`` on every kind of number the
book trains and tests on, in all three languages, and reads nothing
else; ``NumberDomain`` refuses inputs outside it and flags exactly the
answers that are wrong."""

import random

import pytest

from transformer_lite.tasks.numbers import (
    LANGUAGES,
    NumberDomain,
    number_splits,
    number_words,
    read_number,
)
from transformer_lite.tasks.slices import number_slices

pytest.importorskip("num2words")


def sample() -> list[int]:
    rng = random.Random(0)
    return sorted(
        set(range(2000))
        | {a * 1000 for a in range(1000)}
        | {
            a * 1000 + b
            for a in (1, 21, 80, 100, 200, 999)
            for b in (0, 1, 80, 100, 999)
        }
        | {rng.randrange(10**6) for _ in range(1500)}
    )


@pytest.mark.parametrize("lang", sorted(LANGUAGES))
def test_read_number_inverts_number_words(lang):
    for n in sample():
        assert read_number(number_words(n, lang), lang) == n, n


def test_every_held_out_family_reads_back():
    splits = number_splits(400, 50, 50, seed=0)
    families = number_slices(splits, size=40, max_digits=6, seed=0)
    assert len(families) >= 3
    for family, numbers in families.items():
        for n in numbers:
            for lang in LANGUAGES:
                assert read_number(number_words(n, lang), lang) == n, (
                    family,
                    n,
                )


@pytest.mark.parametrize(
    "text, lang",
    [
        ("Guten Morgen", "de"), ("eine Million", "de"),
        ("dreiundzwanzig Äpfel", "de"), ("dreiundzwanzig ", "de"),
        ("Dreiundzwanzig", "de"), ("zweiundzwanzigzwanzig", "de"),
        ("einstausend", "de"), ("", "de"), ("un million", "fr"),
        ("vingt-et-un", "fr"), ("quatre vingt", "fr"),
        ("twenty one", "en"), ("zero thousand and seven", "en"),
        ("one thousand one hundred", "en"), ("one million", "en"),
    ],
)  # fmt: skip
def test_other_text_reads_as_no_number(text, lang):
    assert read_number(text, lang) is None


def test_a_longer_range_reads_millions():
    for n in (10**6, 21 * 10**6 + 5, 999_999_999):
        for lang in LANGUAGES:
            assert read_number(number_words(n, lang), lang, max_digits=9) == n
    assert read_number(number_words(10**6, "de"), "de", max_digits=6) is None


def test_bad_arguments_are_refused():
    assert read_number(21, "de") is None  # not a str: not number words
    with pytest.raises(ValueError, match="lang must be one of"):
        read_number("zwei", "xx")
    with pytest.raises(ValueError, match="max_digits"):
        read_number("zwei", "de", max_digits=0)
    with pytest.raises(ValueError, match="pair must be one of"):
        NumberDomain("de-fr")


@pytest.mark.parametrize("pair", ["de-en", "fr-en"])
def test_the_round_trip_flags_exactly_the_wrong_answers(pair):
    """On inputs of the domain, an answer passes iff it is the right
    one: number words name one number each."""
    domain = NumberDomain(pair)
    src, tgt = domain.languages
    rng = random.Random(1)
    numbers = [rng.randrange(10**6) for _ in range(200)]
    for n in numbers:
        text = number_words(n, src)
        assert domain.problem(text) is None
        assert domain.doubt(text, number_words(n, tgt)) is None
        other = number_words(rng.randrange(10**6), tgt)
        if other != number_words(n, tgt):
            assert "does not round-trip" in domain.doubt(text, other)
        assert "not the English words" in domain.doubt(text, other + " and")


def test_the_domain_says_what_it_was_trained_on():
    domain = NumberDomain("de-en", 4)
    assert domain.problem("einhunderttausend") == (
        "not the German words of a number below 10,000, which is all "
        "this model was trained on"
    )
    assert NumberDomain.from_dict(domain.to_dict()) == domain
