"""Number words to translate (chapter 7): a real translation task made
offline, with splits that keep test numbers out of training.
"""

import collections
import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from transformer_lite.checks import check_int
from transformer_lite.extras import require
from transformer_lite.tasks.corpus import check_sizes

__all__ = [
    "LANGUAGES",
    "MAX_DIGITS",
    "PAIRS",
    "NumberDomain",
    "balance_digits",
    "number_pairs",
    "number_splits",
    "number_words",
    "read_number",
    "repeated_numbers",
    "sparse_numbers",
]

MAX_DIGITS = 6  # numbers below a million by default
MAX_DIGITS_LIMIT = 15  # num2words writes every number below 10**15
LANGUAGES = {"de": "German", "en": "English", "fr": "French"}
PAIRS = ("de-en", "fr-en")  # source-target, as the Annotated Transformer
ZERO_CHANCE = 2 / 3  # of each digit but the first, in sparse_numbers
REPEAT_CHANCE = 1 / 2  # of each digit but the first, in repeated_numbers


@functools.lru_cache(maxsize=2**20)
def number_words(number: int, lang: str) -> str:
    """``number`` written out in words (``num2words``), e.g.
    ``number_words(421, "de") == "vierhunderteinundzwanzig"``."""
    num2words = require("num2words", "translate").num2words
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
    check_sizes(n_train=n_train, n_valid=n_valid, n_test=n_test)
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS_LIMIT)
    check_int("seed", seed, low=0)  # None would seed from the clock
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
    check_sizes(at_least=at_least)
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


def _draw_outside(
    count: int,
    draw: Callable[[random.Random, int], int],
    *,
    exclude: set[int] | frozenset[int],
    max_digits: int,
    seed: int,
) -> list[int]:
    """``count`` numbers from ``draw(rng, digits)``, each with a count of
    digits uniform in 4..``max_digits``; a number in ``exclude`` is drawn
    again. Numbers may repeat. Same arguments, same list."""
    check_sizes(count=count)
    check_int("max_digits", max_digits, low=4, high=MAX_DIGITS_LIMIT)
    check_int("seed", seed, low=0)
    rng = random.Random(seed)
    drawn: list[int] = []
    for _ in range(100 * count):  # exclude may hold most round numbers
        if len(drawn) == count:
            return drawn
        number = draw(rng, rng.randint(4, max_digits))
        if number not in exclude:
            drawn.append(number)
    raise ValueError(
        f"could not draw {count} numbers outside exclude "
        f"({len(exclude)} numbers): exclude fewer"
    )


def _sparse(rng: random.Random, digits: int) -> int:
    drawn = [rng.randint(1, 9)]
    for _ in range(digits - 1):
        zero = rng.random() < ZERO_CHANCE
        drawn.append(0 if zero else rng.randint(1, 9))
    return int("".join(map(str, drawn)))


def _repeated(rng: random.Random, digits: int) -> int:
    drawn = [rng.randint(1, 9)]
    for _ in range(digits - 1):
        again = rng.random() < REPEAT_CHANCE
        drawn.append(rng.choice(drawn) if again else rng.randint(0, 9))
    return int("".join(map(str, drawn)))


def sparse_numbers(
    count: int,
    *,
    exclude: set[int] | frozenset[int] = frozenset(),
    max_digits: int = MAX_DIGITS,
    seed: int = 0,
) -> list[int]:
    """``count`` numbers of four or more digits, most of them zeros
    (chapter 7): round numbers such as 40 000, and numbers such as
    400 003 or 200 250, whose words leave whole parts unsaid.

    Each is drawn by a count of digits, uniform in 4..``max_digits``, a
    first digit 1..9, and every other digit 0 with probability
    ``ZERO_CHANCE`` (2/3), else 1..9; a number in ``exclude`` is drawn
    again. Numbers may repeat: there are few round numbers. Same
    arguments, same list.
    """
    return _draw_outside(count, _sparse, exclude=exclude,
                         max_digits=max_digits, seed=seed)  # fmt: skip


def repeated_numbers(
    count: int,
    *,
    exclude: set[int] | frozenset[int] = frozenset(),
    max_digits: int = MAX_DIGITS,
    seed: int = 0,
) -> list[int]:
    """``count`` numbers of four or more digits that say the same words
    twice (chapter 7): 999 104, 505 008, 313 109, where a model that
    finds its place in the source by content alone copies the wrong
    *neuf* or *fünf*.

    Each is drawn by a count of digits, uniform in 4..``max_digits``, a
    first digit 1..9, and every other digit, with probability
    ``REPEAT_CHANCE`` (1/2), a copy of a digit already drawn (any, with
    equal chance), else 0..9; a number in ``exclude`` is drawn again.
    Same arguments, same list.
    """
    return _draw_outside(count, _repeated, exclude=exclude,
                         max_digits=max_digits, seed=seed)  # fmt: skip


# Reading number words back: the inverse of number_words, for the
# translator's check of its own domain and answers.

# What may follow "tausend", "mille", "thousand": nothing (German writes
# one word), a space, a comma, "and".
SEPARATORS = ("", " ", ", ", " and ")


@functools.cache
def _lexicon(lang: str, max_digits: int) -> tuple[dict, tuple]:
    """The words of every number below 1000, and of every a x 1000**k
    below 10**max_digits (a = 1..999): about 1,000 + 999 per power of a
    thousand calls to num2words, made once per language."""
    below = {
        number_words(n, lang): n for n in range(min(1000, 10**max_digits))
    }
    scaled = tuple(
        (number_words(a * 1000**k, lang), a * 1000**k, 1000**k)
        for k in range(1, (max_digits - 1) // 3 + 1)
        for a in range(1, 1000)
        if a * 1000**k < 10**max_digits
    )
    return below, scaled


def _readings(
    text: str, below: dict, scaled: tuple, limit: int
) -> Iterator[int]:
    """Numbers below ``limit`` that ``text`` may be the words of: the
    number below 1000 it names, or a x 1000**k named by its start and
    followed by a reading of the rest. Candidates only: read_number
    keeps the one whose words are ``text``."""
    if text in below and below[text] < limit:
        yield below[text]
    for words, value, scale in scaled:
        if value >= limit or not text.startswith(words):
            continue
        rest = text[len(words) :]
        if not rest:
            yield value
            continue
        for sep in SEPARATORS:
            if rest.startswith(sep):
                for low in _readings(rest[len(sep) :], below, scaled, scale):
                    yield value + low


def read_number(
    text: object, lang: str, max_digits: int = MAX_DIGITS
) -> int | None:
    """The number below 10**``max_digits`` that ``number_words`` writes
    as exactly ``text`` in ``lang``, or None: ``read_number(
    "vierhunderteinundzwanzig", "de") == 421``; ``"Guten Morgen"``,
    ``"dreiundzwanzig Äpfel"`` and ``"eine Million"`` (with six digits)
    give None. Every candidate is checked by writing it out again, so a
    number is never read from words that are not its own."""
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS_LIMIT)
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {sorted(LANGUAGES)}: {lang!r}")
    if not isinstance(text, str):
        return None
    below, scaled = _lexicon(lang, max_digits)
    for n in _readings(text, below, scaled, 10**max_digits):
        if number_words(n, lang) == text:
            return n
    return None


@dataclass(frozen=True)
class NumberDomain:
    """What a translator of number words was trained on (chapter 7):
    the words of the numbers below 10**``max_digits`` in the source
    language of ``pair``. Saved in the translator's checkpoint.

    :meth:`problem` refuses an input outside it; :meth:`doubt` flags a
    translation that does not round-trip: read as a number in the
    target language and written out in the source language, it must give
    the input again. Number words name one number each, so on inputs of
    the domain the round trip flags exactly the wrong translations.
    """

    pair: str
    max_digits: int = MAX_DIGITS

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(f"pair must be one of {PAIRS}, got {self.pair!r}")
        check_int("max_digits", self.max_digits, low=1, high=MAX_DIGITS_LIMIT)

    @property
    def languages(self) -> tuple[str, str]:
        src, tgt = self.pair.split("-")
        return src, tgt

    def _range(self) -> str:
        return f"below {10**self.max_digits:,}"

    def problem(self, text: str) -> str | None:
        """Why ``text`` is outside the domain, or None."""
        src, _ = self.languages
        if read_number(text, src, self.max_digits) is None:
            return (
                f"not the {LANGUAGES[src]} words of a number "
                f"{self._range()}, which is all this model was trained on"
            )
        return None

    def doubt(self, text: str, translation: str) -> str | None:
        """Why ``translation`` of ``text`` cannot be right, or None."""
        src, tgt = self.languages
        n = read_number(translation, tgt, self.max_digits)
        shown = (
            translation if len(translation) <= 60 else translation[:57] + "..."
        )
        if n is None:
            return (
                f"the model's answer {shown!r} is not the "
                f"{LANGUAGES[tgt]} words of a number {self._range()}"
            )
        back = number_words(n, src)
        if back != text:
            return (
                f"the model's answer {shown!r} is {n:,}, which is "
                f"{back!r} in {LANGUAGES[src]}: it does not round-trip"
            )
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> "NumberDomain":
        """From :meth:`to_dict`'s output, as read from an untrusted
        checkpoint: exactly its fields, each checked."""
        fields = {"pair", "max_digits"}
        if not isinstance(data, dict) or set(data) != fields:
            raise ValueError(
                f"a number domain is a dict with the keys {sorted(fields)}, "
                f"got {data!r:.80}"
            )
        return cls(**data)
