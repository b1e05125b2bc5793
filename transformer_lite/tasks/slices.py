"""Evaluation by slice (chapter 7): named families of numbers that people
type first, each scored on its own, so that a good average cannot hide a
family the model gets wrong.

Every family is drawn from the held-out side of the split only: a
number of the training split is never a member, so a family measures
translation of numbers the model has not seen (``tests/test_slices.py``
checks it). A family small enough to list is complete (every held-out
number 0-999, every held-out round number); a large one is a seeded
sample of ``size`` held-out members.
"""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformer_lite.checks import check_int
from transformer_lite.tasks.numbers import (
    MAX_DIGITS,
    MAX_DIGITS_LIMIT,
    number_words,
)

__all__ = [
    "HELD_OUT",
    "SliceScore",
    "number_slices",
    "score_slices",
    "slice_table",
]

# Each sampled family draws up to 50 x size candidates: beyond this size
# the families (at most 9,000 numbers of 4 digits) run out, and the draws
# take minutes, then hours.
MAX_SLICE_SIZE = 5000
HELD_OUT = "random held-out"  # the test split: the aggregate score
TEENS_AND_X1 = (*range(11, 20), *range(21, 100, 10))  # 11..19, 21, .., 91


@dataclass
class SliceScore:
    """A family's score: exact match (%) and the wrong outputs."""

    numbers: list[int]  # the family's members, ascending
    exact: float  # exact match, %, of the family
    worst: list[tuple[int, str, str]] = field(default_factory=list)
    # (number, output, reference) of up to ``n_worst`` wrong outputs


def _zeros(n: int) -> int:
    return str(n).count("0")


def _with_zeros(rng: random.Random, max_digits: int) -> int:
    """A number of 4..max_digits digits with three or more zero digits."""
    digits = rng.randint(4, max_digits)
    zeros = rng.randint(3, digits - 1)
    places = set(rng.sample(range(1, digits), zeros))  # never the first
    return int("".join("0" if i in places else str(rng.randint(1, 9))
                       for i in range(digits)))  # fmt: skip


def _teen_or_x1(rng: random.Random, max_digits: int) -> int:
    """A number whose every group of three digits ends in 11-19 or
    21, 31, .., 91: the irregular forms, in every position."""
    groups = rng.randint(1, (max_digits - 2) // 3 + 1)
    number = 0
    for g in range(groups):
        hundreds = rng.randint(0, 9) if 3 * g + 3 <= max_digits else 0
        number += (100 * hundreds + rng.choice(TEENS_AND_X1)) * 1000**g
    return number


def _uniform(digits: int) -> Callable[[random.Random, int], int]:
    def draw(rng: random.Random, max_digits: int) -> int:
        return rng.randrange(10 ** (digits - 1), 10**digits)

    return draw


def _largest(rng: random.Random, max_digits: int) -> int:
    return rng.randrange(max(0, 10**max_digits - 1000), 10**max_digits)


def number_slices(
    splits: dict[str, list[int]],
    *,
    size: int = 200,
    max_digits: int = MAX_DIGITS,
    seed: int = 0,
) -> dict[str, list[int]]:
    """Named families of held-out numbers (chapter 7).

    A member is any number below ``10**max_digits`` that is not in
    ``splits["train"]``. Complete: every such number 0-999, and every
    such round number k x 10^n (k = 1..9). Sampled, ``size`` each: numbers
    with three or more zero digits, numbers made of 11-19 and x1 forms
    in every group of three digits, the largest thousand numbers, and
    random numbers of each count of digits from 4 up. ``HELD_OUT`` is
    ``splits["test"]`` itself. Families may overlap each other; an empty
    family is left out.

    Returns:
        ``{name: sorted numbers}``, in the order of the table.
    """
    check_int("size", size, low=1, high=MAX_SLICE_SIZE)
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS_LIMIT)
    check_int("seed", seed, low=0)
    if "train" not in splits or "test" not in splits:
        raise ValueError(
            f"splits must have 'train' and 'test', got {sorted(splits)}"
        )
    train = set(splits["train"])
    top = 10**max_digits
    complete = {
        "0-999": range(min(1000, top)),
        "round k x 10^n": sorted(
            k * 10**n for k in range(1, 10) for n in range(max_digits)
        ),
    }
    sampled = {
        "3+ zeros": _with_zeros,
        "11-19, x1": _teen_or_x1,
        "largest": _largest,
        **{f"{d} digits": _uniform(d) for d in range(4, max_digits + 1)},
    }
    if max_digits < 4:
        del sampled["3+ zeros"]
    if max_digits < 2:
        del sampled["11-19, x1"]
    families = {n: [x for x in xs if x not in train]
                for n, xs in complete.items()}  # fmt: skip
    rng = random.Random(seed)
    for name, draw in sampled.items():
        members: dict[int, None] = {}  # insertion-ordered set
        for _ in range(50 * size):  # a family may have few held-out
            if len(members) == size:
                break
            number = draw(rng, max_digits)
            if number not in train:
                members[number] = None
        families[name] = sorted(members)
    families[HELD_OUT] = sorted(splits["test"])
    return {name: xs for name, xs in families.items() if xs}


def score_slices(
    translator,
    families: dict[str, Sequence[int]],
    *,
    pair: str = "de-en",
    beam_size: int = 4,
    n_worst: int = 3,
) -> dict[str, SliceScore]:
    """Exact match of ``translator`` on every family (chapter 7).

    Each distinct number is translated once (with ``beam_size``, as
    ``Translator.translate``); ``worst`` lists up to ``n_worst`` wrong
    outputs of a family, the numbers with the most zero digits first.
    """
    check_int("n_worst", n_worst, low=0)
    src, tgt = pair.split("-")
    numbers = sorted({n for xs in families.values() for n in xs})
    outputs = translator.translate(
        [number_words(n, src) for n in numbers], beam_size=beam_size
    )
    output_of = dict(zip(numbers, outputs, strict=True))
    scored = {}
    for name, xs in families.items():
        wrong = [(n, output_of[n], number_words(n, tgt)) for n in xs
                 if output_of[n] != number_words(n, tgt)]  # fmt: skip
        wrong.sort(key=lambda row: (-_zeros(row[0]), row[0]))
        exact = 100 * (1 - len(wrong) / len(xs)) if xs else float("nan")
        scored[name] = SliceScore(sorted(xs), exact, wrong[:n_worst])
    return scored


def slice_table(scored: dict[str, SliceScore]) -> str:
    """A plain-text table: one line per family, its size, exact match
    and its first wrong output, if any."""
    width = max(len(name) for name in scored)
    lines = [f"{'family':{width}s} {'size':>5s} {'exact %':>7s}  worst"]
    for name, s in scored.items():
        worst = ""
        if s.worst:
            n, out, ref = s.worst[0]
            worst = f"{n}: {out!r} (not {ref!r})"
        lines.append(
            f"{name:{width}s} {len(s.numbers):5d} {s.exact:7.1f}  {worst}"
        )
    return "\n".join(lines)
