"""Data for training: the copy task (chapter 6) and, for chapter 7, number
words to translate, a TSV corpus reader and length-bucketed batches.

The copy task asks the model to reproduce its input: src == tgt. It needs
no corpus, any architecture bug shows up as a failure to learn it, and a
correct Transformer learns it in seconds. Every sequence reads

    BOS x_1 ... x_n EOS PAD ... PAD

with symbols x_i drawn uniformly from the ids that are not special.
"""

import collections
import functools
import random

import torch
from torch import Tensor

from transformer_lite.training import Batch

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FIRST_SYMBOL_ID",
    "HELD_OUT_SEED",
    "LANGUAGES",
    "MAX_DIGITS",
    "PAD_ID",
    "PAIRS",
    "balance_digits",
    "bucket_batches",
    "copy_task_batches",
    "copy_task_held_out",
    "copy_task_sequences",
    "number_pairs",
    "number_splits",
    "number_words",
    "pad_sequences",
    "read_tsv",
]

PAD_ID = 0  # padding, ignored by masks and the loss
BOS_ID = 1  # begin-of-sequence, the first token of src, tgt and outputs
EOS_ID = 2  # end-of-sequence, where decoding stops
FIRST_SYMBOL_ID = 3  # symbols to copy are FIRST_SYMBOL_ID .. V - 1
HELD_OUT_SEED = 2**31 - 1  # the held-out set's seed; train with another


def _generator(generator_or_seed: torch.Generator | int) -> torch.Generator:
    if isinstance(generator_or_seed, torch.Generator):
        return generator_or_seed
    if isinstance(generator_or_seed, bool) or not isinstance(
        generator_or_seed, int
    ):
        raise ValueError(
            "generator_or_seed must be a torch.Generator or an int, got "
            f"{generator_or_seed!r}"
        )
    return torch.Generator().manual_seed(generator_or_seed)


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def copy_task_sequences(
    n_sequences: int,
    seq_len: int,
    vocab_size: int,
    generator_or_seed: torch.Generator | int,
    min_len: int | None = None,
) -> Tensor:
    """Random sequences for the copy task, drawn on the CPU.

    Args:
        n_sequences: N, how many sequences.
        seq_len: the most symbols in a sequence (BOS and EOS not counted).
        vocab_size: V, special ids included; V - FIRST_SYMBOL_ID symbols.
        generator_or_seed: a seed, or a ``torch.Generator`` to draw from
            (it advances, so successive calls give new data).
        min_len: the fewest symbols; lengths are uniform in
            [min_len, seq_len]. None: every sequence has seq_len symbols.

    Shape:
        output: (N, seq_len + 2).
    """
    _check_sizes(n_sequences=n_sequences, seq_len=seq_len)
    if not isinstance(vocab_size, int) or vocab_size <= FIRST_SYMBOL_ID:
        raise ValueError(
            f"vocab_size must be an int > {FIRST_SYMBOL_ID}: ids 0.."
            f"{FIRST_SYMBOL_ID - 1} are PAD, BOS and EOS and at least one "
            f"symbol is needed; got {vocab_size!r}"
        )
    if min_len is not None and (
        not isinstance(min_len, int) or not 1 <= min_len <= seq_len
    ):
        raise ValueError(
            f"min_len must be None or an int in [1, seq_len={seq_len}], "
            f"got {min_len!r}"
        )
    g = _generator(generator_or_seed)
    N = n_sequences
    symbols = torch.randint(
        FIRST_SYMBOL_ID, vocab_size, (N, seq_len), generator=g
    )  # (N, seq_len)
    if min_len is None:
        lengths = torch.full((N,), seq_len)
    else:
        lengths = torch.randint(min_len, seq_len + 1, (N,), generator=g)
    beyond = torch.arange(seq_len) >= lengths.unsqueeze(1)  # (N, seq_len)
    symbols = symbols.masked_fill(beyond, PAD_ID)
    bos = torch.full((N, 1), BOS_ID)
    sequences = torch.cat([bos, symbols, torch.full((N, 1), PAD_ID)], dim=1)
    eos_at = (lengths + 1).unsqueeze(1)  # (N, 1), just after the last symbol
    return sequences.scatter(1, eos_at, EOS_ID)  # (N, seq_len + 2)


def copy_task_batches(
    n_batches: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    generator_or_seed: torch.Generator | int,
    min_len: int | None = None,
    device: torch.device | str | None = None,
) -> list[Batch]:
    """``n_batches`` copy-task batches (src == tgt), PAD_ID as padding.

    Same seed, same batches. For fresh data every epoch, pass ``fit`` a
    function that calls this with one shared ``torch.Generator``.
    Arguments as :func:`copy_task_sequences`.

    Shape:
        each batch: src (B, seq_len + 2), tgt_in and tgt_out
        (B, seq_len + 1), with B = batch_size.
    """
    _check_sizes(n_batches=n_batches, batch_size=batch_size)
    sequences = copy_task_sequences(
        n_batches * batch_size,
        seq_len,
        vocab_size,
        generator_or_seed,
        min_len,
    ).to(device)  # (n_batches * B, seq_len + 2)
    return [Batch(x, x, PAD_ID) for x in sequences.split(batch_size)]


def copy_task_held_out(
    n_sequences: int,
    seq_len: int,
    vocab_size: int,
    min_len: int | None = None,
    seed: int = HELD_OUT_SEED,
    device: torch.device | str | None = None,
) -> Batch:
    """A fixed held-out set: one :class:`Batch` of ``n_sequences``, drawn
    with ``seed`` (train with another seed, so the sets are independent).

    Decode ``batch.src`` and compare with ``batch.tgt`` (``exact_match``).
    """
    sequences = copy_task_sequences(
        n_sequences, seq_len, vocab_size, seed, min_len
    )
    return Batch(sequences, sequences, PAD_ID).to(device or "cpu")


# Chapter 7: a real translation task, generated offline.

MAX_DIGITS = 6  # numbers below a million by default
LANGUAGES = {"de": "German", "en": "English", "fr": "French"}
PAIRS = ("de-en", "fr-en")  # source-target, as the Annotated Transformer


@functools.lru_cache(maxsize=2**20)
def number_words(number: int, lang: str) -> str:
    """``number`` written out in words (``num2words``), e.g.
    ``number_words(421, "de") == "vierhunderteinundzwanzig"``."""
    from num2words import num2words

    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {sorted(LANGUAGES)}: {lang!r}")
    return num2words(number, lang=lang)


def number_splits(
    n_train: int,
    n_valid: int,
    n_test: int,
    max_digits: int = MAX_DIGITS,
    seed: int = 0,
) -> dict[str, list[int]]:
    """Distinct numbers for training, validation and test (chapter 7).

    Each number is drawn by first drawing its count of digits, uniform in
    1..``max_digits``, then a number with that many digits (0..9 for one),
    so short numbers are as likely as long ones; repeats are drawn again.
    The distinct numbers are shuffled and cut into the three splits: no
    number is in two of them. Same arguments, same splits.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``.
    """
    _check_sizes(n_train=n_train, n_valid=n_valid, n_test=n_test)
    _check_sizes(max_digits=max_digits)
    total = n_train + n_valid + n_test
    if total > 10**max_digits // 2:
        raise ValueError(
            f"{total} distinct numbers asked for, but numbers of at most "
            f"{max_digits} digits allow {10**max_digits // 2} at most"
        )
    rng = random.Random(seed)
    drawn: dict[int, None] = {}  # insertion-ordered set
    while len(drawn) < total:
        digits = rng.randint(1, max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        drawn[rng.randrange(low, 10**digits)] = None
    numbers = list(drawn)
    rng.shuffle(numbers)
    return {
        "train": numbers[:n_train],
        "valid": numbers[n_train : n_train + n_valid],
        "test": numbers[n_train + n_valid :],
    }


def balance_digits(numbers: list[int], at_least: int) -> list[int]:
    """The numbers, with those of rare digit counts repeated (chapter 7).

    A split of distinct numbers runs out of short ones: there are ten of
    one digit and ninety of two, against 900 000 of six. Every number of
    a digit count with ``c`` members appears ``max(1, round(at_least /
    c))`` times, so each count of digits holds about ``at_least``
    entries or more. Order is kept, copies next to each other;
    ``bucket_batches`` shuffles.

    Example: ``balance_digits([5, 7, 21, 4000], 4) == [5, 5, 7, 7, 21,
    21, 21, 21, 4000, 4000, 4000, 4000]``.
    """
    _check_sizes(at_least=at_least)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
        raise ValueError("numbers must be ints")
    if any(n < 0 for n in numbers):
        raise ValueError(f"numbers must be >= 0, got {min(numbers)}")
    count = collections.Counter(len(str(n)) for n in numbers)
    copies = {d: max(1, round(at_least / c)) for d, c in count.items()}
    return [n for n in numbers for _ in range(copies[len(str(n))])]


def number_pairs(
    numbers: list[int], pair: str = "de-en"
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of number words, e.g.
    ``("einundzwanzig", "twenty-one")`` for 21 and ``pair="de-en"``."""
    if pair not in PAIRS:
        raise ValueError(f"pair must be one of {PAIRS}, got {pair!r}")
    src, tgt = pair.split("-")
    return [(number_words(n, src), number_words(n, tgt)) for n in numbers]


def read_tsv(path: str) -> list[tuple[str, str]]:
    """Read a parallel corpus: one ``source<TAB>target`` pair per line,
    UTF-8 (e.g. ``paste train.de train.en > train.tsv`` for Multi30k).
    Blank lines are skipped; any other malformed line raises a
    ``ValueError`` naming its line number."""
    pairs = []
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({err.reason})"
                ) from err
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(
                    f"{path}, line {number}: expected source<TAB>target "
                    f"(2 tab-separated fields), got {len(fields)}: "
                    f"{line[:60]!r}"
                )
            source, target = (field.strip() for field in fields)
            if not source or not target:
                side = "source" if not source else "target"
                raise ValueError(f"{path}, line {number}: empty {side}")
            pairs.append((source, target))
    if not pairs:
        raise ValueError(f"{path} holds no sentence pairs")
    return pairs


def pad_sequences(sequences: list[list[int]], pad_id: int = PAD_ID) -> Tensor:
    """Stack token id lists into one tensor, padding with ``pad_id``.

    Shape:
        output: (N, L), L the longest sequence.
    """
    longest = max(len(s) for s in sequences)
    return torch.tensor(
        [list(s) + [pad_id] * (longest - len(s)) for s in sequences]
    )  # (N, L)


def bucket_batches(
    src: list[list[int]],
    tgt: list[list[int]],
    batch_size: int,
    generator_or_seed: torch.Generator | int,
    pad_id: int = PAD_ID,
) -> list[Batch]:
    """Length-bucketed batches (chapter 7): examples sorted by length (ties
    broken at random) and cut into batches of ``batch_size``, the batches
    in random order. Similar lengths share a batch, so little padding.

    Args:
        src, tgt: token ids of each example (BOS and EOS included).
        generator_or_seed: for the tie breaks and the order; pass one
            ``torch.Generator`` every epoch for fresh batches.

    Shape:
        each batch: src (B, S), tgt (B, T + 1), B <= batch_size.
    """
    _check_sizes(batch_size=batch_size)
    if len(src) != len(tgt) or not src:
        raise ValueError(
            f"src and tgt must be non-empty and equally long, got "
            f"{len(src)} and {len(tgt)}"
        )
    g = _generator(generator_or_seed)
    ties = torch.rand(len(src), generator=g).tolist()
    order = sorted(
        range(len(src)), key=lambda i: (len(src[i]), len(tgt[i]), ties[i])
    )
    chunks = [
        order[i : i + batch_size] for i in range(0, len(order), batch_size)
    ]
    batches = [
        Batch(
            pad_sequences([src[i] for i in chunk], pad_id),
            pad_sequences([tgt[i] for i in chunk], pad_id),
            pad_id,
        )
        for chunk in chunks
    ]
    shuffled = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in shuffled]
