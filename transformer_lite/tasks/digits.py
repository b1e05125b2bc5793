"""Handwritten numbers to read aloud (chapter 11): scikit-learn's 8x8
digits (1,797 images, shipped with the package: no download), split
into training and test images, composed side by side into numbers of
one to three digits, with their English words as targets.

A composed number takes every digit image from one split, so a test
number is written only in handwriting the model never saw in training.
"""

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lite.checks import check_int, check_real
from transformer_lite.extras import require
from transformer_lite.tasks.corpus import generator as make_generator
from transformer_lite.tasks.numbers import number_words
from transformer_lite.tasks.tokenizer import SubwordTokenizer

__all__ = [
    "DIGIT_SIZE",
    "MAX_DIGITS",
    "compose_numbers",
    "digit_columns",
    "digit_splits",
    "draw_numbers",
    "number_images",
    "number_targets",
    "number_tokenizer",
    "shift_images",
]

DIGIT_SIZE = 8  # pixels per side of one digit image
MAX_DIGITS = 3  # numbers 0..999: up to three digits side by side
PIXEL_MAX = 16.0  # the digits' pixels are 0..16 (ink)


def digit_splits(
    test_fraction: float = 0.25, seed: int = 0
) -> dict[str, tuple[Tensor, Tensor]]:
    """scikit-learn's digits, shuffled and cut into disjoint training
    and test images (the same share of each digit in both).

    Pixels are scaled to [0, 1], 1 the darkest ink.

    Returns:
        ``{"train": (images, labels), "test": (images, labels)}``;
        images (n, 1, 8, 8) float32, labels (n,) int64 digits.
    """
    check_real("test_fraction", test_fraction, low=0.0, high=1.0)
    check_int("seed", seed, low=0)
    datasets = require("sklearn.datasets", "vision")
    digits = datasets.load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / PIXEL_MAX
    images = images.unsqueeze(1)  # (n, 1, 8, 8)
    labels = torch.tensor(digits.target, dtype=torch.int64)  # (n,)
    rng = torch.Generator().manual_seed(seed)
    train, test = [], []
    for digit in range(10):
        index = (labels == digit).nonzero().squeeze(1)
        index = index[torch.randperm(len(index), generator=rng)]
        n_test = round(test_fraction * len(index))
        test.append(index[:n_test])
        train.append(index[n_test:])
    splits = {"train": torch.cat(train), "test": torch.cat(test)}
    if min(len(index) for index in splits.values()) == 0:
        raise ValueError(f"test_fraction {test_fraction} leaves a split empty")
    return {k: (images[i], labels[i]) for k, i in splits.items()}


def shift_images(
    images: Tensor,
    max_shift: int,
    generator: torch.Generator | int = 0,
) -> Tensor:
    """Each image moved by its own random whole-pixel shift, up to
    ``max_shift`` pixels along each axis; pixels moved in are blank.

    Shape:
        images: (B, K, Hi, Wi); output: (B, K, Hi, Wi).
    """
    check_int("max_shift", max_shift, low=0)
    if max_shift == 0:
        return images.clone()
    rng = make_generator(generator)
    m, (B, _, Hi, Wi) = max_shift, images.shape
    shifts = torch.randint(-m, m + 1, (B, 2), generator=rng)  # (B, 2)
    padded = F.pad(images, (m, m, m, m))  # (B, K, Hi + 2m, Wi + 2m)
    out = torch.empty_like(images)
    for dy, dx in itertools.product(range(-m, m + 1), repeat=2):
        rows = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero()[:, 0]
        y, x = m - dy, m - dx  # content moves down by dy, right by dx
        out[rows] = padded[rows, :, y : y + Hi, x : x + Wi]
    return out


def draw_numbers(
    count: int, max_digits: int = MAX_DIGITS, seed: int = 0
) -> list[int]:
    """``count`` numbers (repeats allowed): the count of digits is
    uniform in 1..``max_digits``, then the number uniform among those
    with that many digits, so one-digit numbers are as common as
    three-digit ones."""
    check_int("count", count, low=1)
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS)
    rng = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_digits + 1, (count,), generator=rng)
    numbers = []
    for k in lengths.tolist():
        low = 0 if k == 1 else 10 ** (k - 1)
        numbers.append(int(torch.randint(low, 10**k, (), generator=rng)))
    return numbers


def digit_columns(number: int, max_digits: int = MAX_DIGITS) -> list[range]:
    """The pixel columns that each digit of ``number`` occupies in its
    composed image, first digit first. Numbers are right-aligned, as in
    a column of figures: the units digit is always in the last cell,
    the tens digit in the one before it."""
    check_int("number", number, low=0, high=10**max_digits - 1)
    k = len(str(number))
    left = (max_digits - k) * DIGIT_SIZE
    return [
        range(left + i * DIGIT_SIZE, left + (i + 1) * DIGIT_SIZE)
        for i in range(k)
    ]


def compose_numbers(
    images: Tensor,
    labels: Tensor,
    numbers: list[int],
    *,
    max_digits: int = MAX_DIGITS,
    max_shift: int = 0,
    generator: torch.Generator | int = 0,
) -> Tensor:
    """One image per number: a random image of each of its digits,
    drawn from ``images``, side by side and right-aligned
    (:func:`digit_columns`) on a blank canvas ``max_digits`` digits
    wide; each digit is shifted within its own cell by up to
    ``max_shift`` pixels (:func:`shift_images`).

    Shape:
        images: (n, 1, 8, 8); labels: (n,);
        output: (len(numbers), 1, 8, 8 * max_digits).
    """
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS)
    if images.dim() != 4 or tuple(images.shape[1:]) != (1, 8, 8):
        raise ValueError(
            f"images must be (n, 1, 8, 8), got {tuple(images.shape)}"
        )
    rng = make_generator(generator)
    pools = [(labels == d).nonzero().squeeze(1) for d in range(10)]
    missing = [d for d, pool in enumerate(pools) if len(pool) == 0]
    if missing:
        raise ValueError(f"no image of the digits {missing} to draw from")
    slots = []  # (row in the output, first column, image index)
    for row, number in enumerate(numbers):
        columns = digit_columns(number, max_digits)
        for digit, span in zip(str(number), columns, strict=True):
            pool = pools[int(digit)]
            pick = pool[int(torch.randint(len(pool), (), generator=rng))]
            slots.append((row, span.start, int(pick)))
    picked = images[[index for _, _, index in slots]]  # (D, 1, 8, 8)
    picked = shift_images(picked, max_shift, rng)
    canvas = images.new_zeros(len(numbers), 1, 8, DIGIT_SIZE * max_digits)
    for (row, left, _), digit in zip(slots, picked, strict=True):
        canvas[row, :, :, left : left + DIGIT_SIZE] = digit
    return canvas


def number_images(
    images: Tensor,
    labels: Tensor,
    count: int,
    *,
    max_digits: int = MAX_DIGITS,
    max_shift: int = 0,
    seed: int = 0,
) -> tuple[Tensor, list[int]]:
    """``count`` numbers (:func:`draw_numbers`) and their images
    (:func:`compose_numbers`), both from ``seed``.

    Shape:
        output: (count, 1, 8, 8 * max_digits) and ``count`` ints.
    """
    numbers = draw_numbers(count, max_digits, seed)
    canvas = compose_numbers(
        images,
        labels,
        numbers,
        max_digits=max_digits,
        max_shift=max_shift,
        generator=seed + 1,
    )
    return canvas, numbers


def number_tokenizer(max_digits: int = MAX_DIGITS) -> SubwordTokenizer:
    """A byte-pair tokenizer (chapter 7) trained on the English words of
    every number with up to ``max_digits`` digits, until every word is
    one token ("seventy", "-", "seven")."""
    check_int("max_digits", max_digits, low=1, high=MAX_DIGITS)
    texts = [number_words(n, "en") for n in range(10**max_digits)]
    return SubwordTokenizer.train(texts, vocab_size=256)


def number_targets(numbers: list[int], tokenizer: SubwordTokenizer) -> Tensor:
    """The numbers' English words as token ids: BOS, words, EOS, then
    padding.

    Shape:
        output: (len(numbers), T).
    """
    return tokenizer.encode_batch([number_words(n, "en") for n in numbers])
