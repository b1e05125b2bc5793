"""Tests for transformer_lite.tasks.copy_task (chapter 6): the copy
task's sequences, batches and held-out set, checked against their
definition (BOS, symbols, EOS, then padding; fixed seeds; no held-out
sequence in training), and, end to end, the whole chapter 6 recipe: a
small model trained on its batches copies every held-out sequence."""

import pytest
import torch
from torch import nn

from transformer_lite import make_model, seed_everything
from transformer_lite.decoding import exact_match, greedy_decode
from transformer_lite.tasks.copy_task import (
    FIRST_SYMBOL_ID,
    copy_task_batches,
    copy_task_held_out,
    copy_task_sequences,
)
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_lite.training import (
    Batch,
    LabelSmoothingLoss,
    TrainOptions,
    noam_scheduler,
    seq2seq_loss,
    train_epoch,
)

V = 13


def lengths_of(sequences: torch.Tensor) -> torch.Tensor:
    """Symbols per row: the position of EOS minus one (for BOS)."""
    return (sequences == EOS_ID).int().argmax(dim=1) - 1


def test_sequences_are_bos_symbols_eos_then_padding():
    x = copy_task_sequences(500, 8, V, 0, min_len=2)
    assert x.shape == (500, 10)
    assert (x[:, 0] == BOS_ID).all()
    assert ((x == EOS_ID).sum(dim=1) == 1).all()  # one EOS per row
    assert (x == BOS_ID).sum() == 500  # BOS only at the start
    n = lengths_of(x)
    position = torch.arange(10)
    symbols = (position >= 1) & (position <= n.unsqueeze(1))
    assert ((x >= FIRST_SYMBOL_ID) & (x < V))[symbols].all()
    assert (x[position > n.unsqueeze(1) + 1] == PAD_ID).all()
    assert set(x[symbols].unique().tolist()) == set(range(FIRST_SYMBOL_ID, V))


def test_lengths_are_fixed_or_span_min_len_to_seq_len():
    fixed = copy_task_sequences(100, 6, V, 1)
    assert (lengths_of(fixed) == 6).all()
    assert not (fixed == PAD_ID).any()
    varied = copy_task_sequences(400, 6, V, 1, min_len=3)
    assert set(lengths_of(varied).tolist()) == {3, 4, 5, 6}


def test_same_seed_same_data_and_a_generator_moves_on():
    a = copy_task_sequences(50, 7, V, 42, min_len=1)
    assert torch.equal(a, copy_task_sequences(50, 7, V, 42, min_len=1))
    assert not torch.equal(a, copy_task_sequences(50, 7, V, 43, min_len=1))
    g = torch.Generator().manual_seed(42)
    first = copy_task_sequences(50, 7, V, g, min_len=1)
    second = copy_task_sequences(50, 7, V, g, min_len=1)
    assert torch.equal(first, a)
    assert not torch.equal(first, second)


def test_batches_copy_the_source_into_the_target():
    batches = copy_task_batches(3, 16, 5, V, 7, min_len=2)
    assert len(batches) == 3
    assert all(isinstance(b, Batch) for b in batches)
    for b in batches:
        assert torch.equal(b.src, b.tgt)
        assert b.src.shape == (16, 7)
        assert b.tgt_out.shape == (16, 6)
        assert b.pad_id == PAD_ID
        assert b.n_tokens == int((lengths_of(b.src) + 1).sum())  # + EOS
    assert not b.src_mask.all()  # padding is masked out
    again = copy_task_batches(3, 16, 5, V, 7, min_len=2)
    assert all(
        torch.equal(b.src, c.src) for b, c in zip(batches, again, strict=True)
    )


def test_held_out_set_is_fixed_and_apart_from_training_data():
    held = copy_task_held_out(64, 10, V)
    assert torch.equal(held.src, copy_task_held_out(64, 10, V).src)
    assert held.src.shape == (64, 12)
    train = torch.cat([b.src for b in copy_task_batches(20, 64, 10, V, 0)])
    seen = {tuple(row) for row in train.tolist()}
    assert not seen & {tuple(row) for row in held.src.tolist()}


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((10, 5, FIRST_SYMBOL_ID, 0), {}, "vocab_size"),
        ((10, 5, 2, 0), {}, "vocab_size"),
        ((10, 5, V, 0), dict(min_len=0), "min_len"),
        ((10, 5, V, 0), dict(min_len=6), "min_len"),
        ((0, 5, V, 0), {}, "n_sequences"),
        ((10, 0, V, 0), {}, "seq_len"),
        ((10, 5, V, 1.5), {}, "generator_or_seed"),
        ((10, 5, V, True), {}, "generator_or_seed"),
    ],
)
def test_sequences_reject_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        copy_task_sequences(*args, **kwargs)


def test_batches_reject_bad_sizes():
    with pytest.raises(ValueError, match="batch_size"):
        copy_task_batches(2, 0, 5, V, 0)
    with pytest.raises(ValueError, match="n_batches"):
        copy_task_batches(0, 4, 5, V, 0)


# ----------------------------------------------------------------------------
# The whole recipe: a small model learns the copy task (chapter 6)

COPY_VOCAB = 13  # PAD, BOS, EOS and 10 symbols
COPY_LEN = 10  # symbols per sequence
COPY_STEPS = 200  # optimizer steps of 64 fresh sequences each
# Token embeddings drawn small, so that positions dominate at the start:
# the default (Xavier) init gives them std 1.3 after the sqrt(d_model)
# scale for a vocabulary this small, and training then needs several
# times the steps and keeps flipping a few sequences. Label smoothing
# (0.1) matters too: without it the held-out score kept oscillating.
EMBED_STD = 0.05


@pytest.mark.slow
def test_small_model_learns_the_copy_task(one_thread):
    seed_everything(0)
    model = make_model(
        COPY_VOCAB,
        COPY_VOCAB,
        n_layers=1,
        d_model=64,
        d_ff=128,
        n_heads=4,
        dropout=0.0,
    )
    for embedding in (model.src_embed, model.tgt_embed):
        nn.init.normal_(embedding.weight, std=EMBED_STD)
    optimizer = torch.optim.Adam(
        model.parameters(), betas=(0.9, 0.98), eps=1e-9
    )
    scheduler = noam_scheduler(optimizer, d_model=64, warmup=50, factor=0.5)
    train = copy_task_batches(COPY_STEPS, 64, COPY_LEN, COPY_VOCAB, 1)
    loss_fn = LabelSmoothingLoss(COPY_VOCAB, PAD_ID, 0.1, reduction="sum")
    train_epoch(
        model,
        train,
        seq2seq_loss(loss_fn),
        optimizer,
        scheduler=scheduler,
        options=TrainOptions(progress=False),
    )
    held_out = copy_task_held_out(500, COPY_LEN, COPY_VOCAB)
    decoded = greedy_decode(
        model,
        held_out.src,
        src_mask=held_out.src_mask,
        max_len=COPY_LEN + 2,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )
    assert exact_match(decoded, held_out.tgt, PAD_ID).all()
