"""Tests for the chapter 7 data in transformer_lite.tasks: number words,
splits, the TSV reader and length-bucketed batches."""

import collections
from pathlib import Path

import pytest
import torch

from transformer_lite.tasks.corpus import (
    bucket_batches,
    pad_sequences,
    read_tsv,
)
from transformer_lite.tasks.numbers import (
    balance_digits,
    number_pairs,
    number_splits,
    number_words,
)
from transformer_lite.tokens import PAD_ID

FIXTURE = Path(__file__).parent / "data" / "tiny_corpus.tsv"


def test_number_words():
    assert number_words(421, "de") == "vierhunderteinundzwanzig"
    assert number_words(97, "fr") == "quatre-vingt-dix-sept"
    assert number_words(21405, "en") == (
        "twenty-one thousand, four hundred and five"
    )
    with pytest.raises(ValueError, match="lang"):
        number_words(1, "xx")


def test_number_pairs():
    assert number_pairs([21], "de-en") == [("einundzwanzig", "twenty-one")]
    assert number_pairs([80], "fr-en") == [("quatre-vingts", "eighty")]
    with pytest.raises(ValueError, match="pair"):
        number_pairs([1], "en-de")


def test_splits_are_disjoint_sized_and_reproducible():
    splits = number_splits(2000, 300, 400, seed=3)
    sizes = {name: len(numbers) for name, numbers in splits.items()}
    assert sizes == {"train": 2000, "valid": 300, "test": 400}
    sets = [set(numbers) for numbers in splits.values()]
    assert sum(map(len, sets)) == 2700  # no repeats within a split
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert number_splits(2000, 300, 400, seed=3) == splits
    assert number_splits(2000, 300, 400, seed=4) != splits


def test_splits_mix_short_and_long_numbers():
    numbers = number_splits(3000, 100, 100, seed=0)["train"]
    assert all(0 <= n < 10**6 for n in numbers)
    digits = [len(str(n)) for n in numbers]
    for d in (3, 4, 5, 6):  # lengths are drawn uniformly
        assert digits.count(d) > 300
    assert max(number_splits(100, 10, 10, max_digits=3)["train"]) < 1000


def test_splits_refuse_impossible_sizes():
    with pytest.raises(ValueError, match="distinct numbers"):
        number_splits(40, 5, 10, max_digits=2)
    with pytest.raises(ValueError, match="n_valid"):
        number_splits(10, 0, 10)


def test_balance_digits_repeats_rare_digit_counts():
    assert balance_digits([5, 7, 21, 4000], 4) == [
        5, 5, 7, 7, 21, 21, 21, 21, 4000, 4000, 4000, 4000]  # fmt: skip
    numbers = number_splits(2000, 10, 10, seed=1)["train"]
    balanced = balance_digits(numbers, 300)
    assert set(balanced) == set(numbers)  # nothing lost, nothing new
    before = collections.Counter(len(str(n)) for n in numbers)
    after = collections.Counter(len(str(n)) for n in balanced)
    assert before[1] == 10 and after[1] == 300  # every digit, 30 times
    assert after[2] == before[2] * round(300 / before[2])
    for d in (4, 5, 6):  # common counts are left alone
        assert before[d] > 300 and after[d] == before[d]
    assert balance_digits(numbers, 1) == numbers


def test_balance_digits_bad_input():
    with pytest.raises(ValueError, match="at_least"):
        balance_digits([1, 2], 0)
    with pytest.raises(ValueError, match=">= 0"):
        balance_digits([1, -2], 3)
    with pytest.raises(ValueError, match="ints"):
        balance_digits([1, "2"], 3)


def test_read_tsv_fixture():
    pairs = read_tsv(FIXTURE)
    assert pairs[0] == ("eins", "one")
    assert ("dreihundertzwölf", "three hundred and twelve") in pairs
    assert pairs[-1] == ("Ein Hund läuft.", "A dog runs.")
    assert len(pairs) == 6  # the blank line is skipped


def test_read_tsv_windows_line_ends(tmp_path):
    path = tmp_path / "crlf.tsv"
    path.write_bytes(b"eins\tone\r\nzwei\ttwo\r\n")
    assert read_tsv(path) == [("eins", "one"), ("zwei", "two")]


@pytest.mark.parametrize(
    "text, message",
    [
        ("eins\tone\nzwei two\n", r"line 2: expected source<TAB>target .*1"),
        ("eins\tone\ta\tb\n", r"line 1: expected .* got 4"),
        ("eins\tone\n\n\t two\n", r"line 3: empty source"),
        ("eins\t \n", r"line 1: empty target"),
        ("\n\n", r"holds no sentence pairs"),
    ],
)
def test_read_tsv_malformed_lines(tmp_path, text, message):
    path = tmp_path / "bad.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_tsv(path)


def test_read_tsv_invalid_utf8(tmp_path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("eins\tone\nfünf\tfive\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
        read_tsv(path)


def test_pad_sequences():
    ids = pad_sequences([[5, 6, 7], [8]], PAD_ID)
    assert torch.equal(ids, torch.tensor([[5, 6, 7], [8, PAD_ID, PAD_ID]]))


def examples(n=103, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 20, (n, 2), generator=g).tolist()
    src = [[1] + [10 + i] * (a - 2) + [2] for i, (a, _) in enumerate(lengths)]
    tgt = [[1] + [10 + i] * (b - 2) + [2] for i, (_, b) in enumerate(lengths)]
    return src, tgt


def test_bucket_batches_hold_every_example_once():
    src, tgt = examples()
    batches = bucket_batches(src, tgt, 16, 0)
    assert [b.src.size(0) for b in batches].count(16) == len(batches) - 1
    seen = sorted(int(b.src[i, 1]) for b in batches for i in range(len(b.src)))
    assert seen == [10 + i for i in range(103)]
    for batch in batches:  # each row keeps its own target
        assert torch.equal(batch.src[:, 1], batch.tgt[:, 1])


def test_bucket_batches_pad_less_than_random_batches():
    src, tgt = examples()

    def padding(batches):
        return sum(int((b.src == PAD_ID).sum()) for b in batches)

    bucketed = bucket_batches(src, tgt, 16, 0)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(src), generator=g)
    shuffled = [src[i] for i in order]
    random_batches = [
        pad_sequences(shuffled[i : i + 16]) for i in range(0, len(src), 16)
    ]
    random_padding = sum(int((b == PAD_ID).sum()) for b in random_batches)
    assert padding(bucketed) < random_padding / 4


def test_bucket_batches_are_reproducible_and_shuffled():
    src, tgt = examples()
    first = bucket_batches(src, tgt, 16, 5)
    again = bucket_batches(src, tgt, 16, 5)
    assert all(
        torch.equal(a.src, b.src) for a, b in zip(first, again, strict=True)
    )
    lengths = [b.src.size(1) for b in first]
    assert lengths != sorted(lengths)  # the batches come in random order
    g = torch.Generator().manual_seed(5)
    one, two = bucket_batches(src, tgt, 16, g), bucket_batches(src, tgt, 16, g)
    assert any(
        not torch.equal(a.src, b.src) for a, b in zip(one, two, strict=True)
    )


def test_read_tsv_drops_a_byte_order_mark(tmp_path):
    """Editors on Windows start UTF-8 files with U+FEFF; it is not part
    of the first source."""
    path = tmp_path / "bom.tsv"
    path.write_bytes("\ufeffeins\tone\nzwei\ttwo\n".encode())
    assert read_tsv(path) == [("eins", "one"), ("zwei", "two")]
    path.write_bytes("eins\tone\n\ufeffzwei\ttwo\n".encode())
    assert read_tsv(path)[1][0] == "\ufeffzwei"  # only at the start
