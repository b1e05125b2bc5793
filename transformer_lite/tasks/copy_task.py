"""The copy task (chapter 6): the model must reproduce its input.

It needs no corpus, any architecture bug shows up as a failure to learn
it, and a correct Transformer learns it in seconds. Every sequence reads

    BOS x_1 ... x_n EOS PAD ... PAD

with symbols x_i drawn uniformly from the ids that are not special.
"""

import torch
from torch import Tensor

from transformer_lite.tasks.corpus import check_sizes, generator
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_lite.training.batch import Batch

__all__ = [
    "FIRST_SYMBOL_ID",
    "HELD_OUT_SEED",
    "copy_task_batches",
    "copy_task_held_out",
    "copy_task_sequences",
]

FIRST_SYMBOL_ID = 3  # symbols to copy are FIRST_SYMBOL_ID .. V - 1
HELD_OUT_SEED = 2**31 - 1  # the held-out set's seed; train with another


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
    check_sizes(n_sequences=n_sequences, seq_len=seq_len)
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
    g = generator(generator_or_seed)
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
    check_sizes(n_batches=n_batches, batch_size=batch_size)
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
