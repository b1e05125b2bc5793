"""Parallel corpora for training (chapter 7): a TSV reader, padding, and
length-bucketed batches.
"""

import torch
from torch import Tensor

from transformer_lite.tokens import PAD_ID
from transformer_lite.training.batch import Batch

__all__ = [
    "bucket_batches",
    "check_sizes",
    "generator",
    "pad_sequences",
    "read_tsv",
]


def generator(generator_or_seed: torch.Generator | int) -> torch.Generator:
    """The generator itself, or a new one seeded with the int."""
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


def check_sizes(**sizes: int) -> None:
    """Raise a ``ValueError`` naming the first size that is not an int
    >= 1 (a bool is not a size)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def read_tsv(path: str) -> list[tuple[str, str]]:
    """Read a parallel corpus: one ``source<TAB>target`` pair per line,
    UTF-8 (e.g. ``paste train.de train.en > train.tsv`` for Multi30k),
    with or without a byte-order mark. Blank lines are skipped; any
    other malformed line raises a ``ValueError`` naming its number."""
    pairs = []
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a byte-order mark
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
    check_sizes(batch_size=batch_size)
    if len(src) != len(tgt) or not src:
        raise ValueError(
            f"src and tgt must be non-empty and equally long, got "
            f"{len(src)} and {len(tgt)}"
        )
    g = generator(generator_or_seed)
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
