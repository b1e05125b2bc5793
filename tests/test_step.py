"""Tests for transformer_lite.training.step (chapter 6): ``train_step``
weighs batches by their tokens (accumulating two batches equals one big
batch, in float64), steps the optimizer and scheduler once per group of
batches, clips the update to ``clip_norm``, wants a loss that sums,
stops on a non-finite loss and checks token ids while the batch is on
the CPU. Most tests drive it through ``train_epoch``, as the loop
calls it."""

import math

import pytest
import torch
from conftest import (
    PAD,
    random_batch,
    random_tokens,
    same_parameters,
    tiny_model,
)
from conftest import VOCAB as V

from transformer_lite.training import (
    Batch,
    History,
    LabelSmoothingLoss,
    noam_lr,
    noam_scheduler,
    train_epoch,
    train_step,
)


def test_accumulating_two_batches_equals_one_big_batch():
    """The halves hold different numbers of real tokens, so the losses
    must be weighted by tokens, not simply divided by `accumulate`."""
    src = random_tokens(6, 7, seed=10)
    tgt = random_tokens(6, 6, seed=11)
    tgt[:2, 3:] = PAD  # the first half is shorter
    whole = Batch(src, tgt, PAD)
    halves = [Batch(src[:3], tgt[:3], PAD), Batch(src[3:], tgt[3:], PAD)]
    assert halves[0].n_tokens != halves[1].n_tokens
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    losses, models = [], []
    for batches, accumulate in (([whole], 1), (halves, 2)):
        model = tiny_model(dtype=torch.float64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses.append(
            train_epoch(
                model,
                batches,
                loss_fn,
                optimizer,
                clip_norm=None,
                accumulate=accumulate,
                progress=False,
            )
        )
        models.append(model)
    assert not same_parameters(models[0], tiny_model(dtype=torch.float64))
    assert same_parameters(*models, atol=1e-12)
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)


def test_optimizer_and_scheduler_step_once_per_group():
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = noam_scheduler(optimizer, 16, warmup=3)
    history = History()
    batches = [random_batch(seed=s) for s in range(5)]
    train_epoch(
        model,
        batches,
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        optimizer,
        scheduler=scheduler,
        accumulate=2,
        progress=False,
        history=history,
    )
    assert scheduler.last_epoch == 3  # groups of 2, 2 and 1 batches
    assert len(history.step_loss) == len(history.lr) == 3
    assert history.lr == pytest.approx([noam_lr(k, 16, 3) for k in (1, 2, 3)])
    steps = {int(s["step"]) for s in optimizer.state.values()}
    assert steps == {3}


@pytest.mark.parametrize("clip_norm", [1e-3, None])
def test_clipping_bounds_the_update(clip_norm):
    model = tiny_model(dtype=torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    train_epoch(
        model,
        [random_batch()],
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        optimizer,
        clip_norm=clip_norm,
        progress=False,
    )
    step = torch.cat(
        [
            (p.detach() - b).flatten()
            for p, b in zip(model.parameters(), before, strict=True)
        ]
    )
    if clip_norm is None:
        assert step.norm() > 0.1  # the raw gradient is far above 1e-3
    else:
        assert step.norm().item() == pytest.approx(clip_norm, rel=1e-6)


def test_sum_loss_is_required():
    """A mean loss would be divided by the token count twice."""
    model = tiny_model()
    with pytest.raises(ValueError, match="reduction='sum'"):
        train_epoch(
            model,
            [random_batch()],
            LabelSmoothingLoss(V, PAD),
            torch.optim.Adam(model.parameters()),
        )


def test_non_finite_loss_stops_training():
    model = tiny_model()
    with pytest.raises(FloatingPointError):
        train_epoch(
            model,
            [random_batch()],
            lambda logits, targets: logits.sum() * math.nan,
            torch.optim.Adam(model.parameters()),
            progress=False,
        )


def test_training_step_checks_ids_where_the_batch_lives_on_the_cpu():
    model = tiny_model()
    bad = random_batch()
    bad.tgt[0, 1] = V  # one past the vocabulary
    bad = Batch(bad.src, bad.tgt, PAD)
    with pytest.raises(ValueError, match=r"batch.tgt holds token ids"):
        train_step(
            model,
            bad,
            LabelSmoothingLoss(V, PAD, reduction="sum"),
            torch.optim.SGD(model.parameters(), lr=0.1),
        )
