"""Evaluation by slice (chapter 7): the families are held out, are what
their names say, and are scored as an independent count says."""

import pytest

from transformer_lite.tasks.numbers import (
    number_splits,
    number_words,
    repeated_numbers,
    sparse_numbers,
)
from transformer_lite.tasks.slices import (
    HELD_OUT,
    TEENS_AND_X1,
    number_slices,
    score_slices,
    slice_table,
)
from transformer_lite.tasks.trainer import TranslateConfig, training_numbers
from transformer_lite.tasks.translate import main


@pytest.fixture(scope="module")
def splits():
    config = TranslateConfig()
    return number_splits(config.n_train, config.n_valid, config.n_test)


@pytest.fixture(scope="module")
def families(splits):
    return number_slices(splits)


def test_no_family_member_is_trained_on(splits, families):
    train = set(splits["train"])
    for name, members in families.items():
        assert not train & set(members), name
    config = TranslateConfig()
    trained = set(training_numbers(splits, config))
    assert trained > train  # sparse and repeated numbers were added ...
    for name, members in families.items():  # ... from outside the families
        assert not trained & set(members), name
    assert not trained & (set(splits["valid"]) | set(splits["test"]))


def test_families_are_what_their_names_say(splits, families):
    train = set(splits["train"])
    assert families["0-999"] == sorted(set(range(1000)) - train)
    rounds = {k * 10**n for k in range(1, 10) for n in range(6)}
    assert families["round k x 10^n"] == sorted(rounds - train)
    assert all(str(n).count("0") >= 3 for n in families["3+ zeros"])
    for n in families["11-19, x1"]:
        groups = f"{n:,}".split(",")
        assert all(int(g) % 100 in TEENS_AND_X1 for g in groups), n
    assert all(999_000 <= n < 10**6 for n in families["largest"])
    for d in (4, 5, 6):
        assert {len(str(n)) for n in families[f"{d} digits"]} == {d}
    assert families[HELD_OUT] == sorted(splits["test"])
    sampled = ("3+ zeros", "11-19, x1", "largest", "5 digits")
    assert all(len(families[name]) == 200 for name in sampled)
    assert len(families["round k x 10^n"]) >= 10  # most long ones
    assert number_slices(splits) == families  # seeded
    assert number_slices(splits, seed=1) != families


@pytest.mark.parametrize("max_digits", [1, 2, 3, 4, 7])
def test_families_stay_in_range(max_digits):
    splits = number_splits(2, 1, 1, max_digits=max_digits)
    for members in number_slices(splits, max_digits=max_digits).values():
        assert members and all(0 <= n < 10**max_digits for n in members)


def test_sparse_numbers():
    drawn = sparse_numbers(500, exclude={1000, 20_000}, seed=3)
    assert len(drawn) == 500 and 1000 not in drawn and 20_000 not in drawn
    assert all(4 <= len(str(n)) <= 6 for n in drawn)
    tails = "".join(str(n)[1:] for n in drawn)  # the first digit is 1..9
    assert 0.6 < tails.count("0") / len(tails) < 0.73  # ZERO_CHANCE, 2/3
    assert drawn == sparse_numbers(500, exclude={1000, 20_000}, seed=3)
    all_round = {k * 10**n for k in range(1, 10) for n in range(3, 4)}
    with pytest.raises(ValueError, match="exclude"):
        sparse_numbers(5, exclude=set(range(10_000)), max_digits=4)
    assert not all_round & set(
        sparse_numbers(50, exclude=all_round, max_digits=4)
    )


def test_repeated_numbers():
    drawn = repeated_numbers(2000, exclude={999_999}, seed=3)
    assert len(drawn) == 2000 and 999_999 not in drawn
    assert all(4 <= len(str(n)) <= 6 for n in drawn)
    assert drawn == repeated_numbers(2000, exclude={999_999}, seed=3)
    # a uniform number of 6 digits repeats one in 85% of draws; here, the
    # second digit alone equals the first in over half (1/2 + 1/20)
    second_is_first = sum(str(n)[1] == str(n)[0] for n in drawn) / 2000
    assert 0.5 < second_is_first < 0.6
    assert sum(str(n)[:3] in {"999", "555"} for n in drawn) > 20
    with pytest.raises(ValueError, match="max_digits"):
        repeated_numbers(5, max_digits=3)


class _Translator:
    """Translates right, except the numbers in ``wrong``."""

    def __init__(self, wrong: set[int], numbers: list[int]):
        self.wrong = wrong
        self.calls = 0
        self.of = {number_words(n, "de"): n for n in numbers}

    def translate(self, texts, beam_size=4):
        self.calls += 1
        of = self.of
        return [
            "nonsense" if of[t] in self.wrong else number_words(of[t], "en")
            for t in texts
        ]


def test_score_slices_counts_as_by_hand():
    families = {"a": [1, 2, 3, 4], "b": [3, 1000, 2005], "c": [7]}
    translator = _Translator({3, 2005}, [1, 2, 3, 4, 7, 1000, 2005])
    scored = score_slices(translator, families, n_worst=5)
    assert translator.calls == 1  # every distinct number once
    assert scored["a"].exact == 75.0 and scored["c"].exact == 100.0
    assert abs(scored["b"].exact - 100 / 3) < 1e-9
    assert scored["b"].worst == [
        (2005, "nonsense", "two thousand and five"),  # more zeros first
        (3, "nonsense", "three"),
    ]
    assert scored["c"].worst == []
    table = slice_table(scored)
    assert len(table.splitlines()) == 4 and "33.3" in table
    assert "2005: 'nonsense'" in table


def test_bad_arguments_are_named(splits):
    with pytest.raises(ValueError, match="size"):
        number_slices(splits, size=0)
    with pytest.raises(ValueError, match="'train' and 'test'"):
        number_slices({"train": [1]})
    for share in ("digits_share", "sparse_share", "repeat_share"):
        with pytest.raises(ValueError, match=share):
            TranslateConfig(**{share: 1.5})


def test_train_prints_the_slice_table(tmp_path, capsys):
    tiny = [
        "--n-train", "200", "--n-valid", "20", "--n-test", "20",
        "--steps", "2", "--save-every", "1", "--keep-last", "1",
        "--d-model", "16", "--d-ff", "32", "--n-layers", "1",
        "--n-heads", "2", "--batch-size", "32", "--max-len", "40",
        "--slice-size", "5", "--quiet",
    ]  # fmt: skip
    assert main(["train", "--model-dir", str(tmp_path), *tiny]) == 0
    out = capsys.readouterr().out
    assert "exact match by family" in out
    for name in ("0-999", "round k x 10^n", "3+ zeros", HELD_OUT):
        assert name in out


def test_a_slice_size_that_would_run_for_hours_is_refused():
    # Before: 10**8 was accepted and made train draw 50 x size numbers
    # per family after training.
    with pytest.raises(ValueError, match="size must be an int in"):
        number_slices({"train": [1], "test": [2]}, size=10**8)
    with pytest.raises(ValueError, match="slice_size must be an int in"):
        TranslateConfig(slice_size=10**8)
    with pytest.raises(ValueError, match="slice_size must be"):
        TranslateConfig(slice_size=True)
