"""Tests for transformer_lite.training.step (chapters 6, 10 and 11):
``train_step`` weighs batches by their tokens (accumulating two batches
equals one big batch, in float64, for a ``Batch`` and for ``Examples``),
equals a hand-written step on ``Examples``, and gives bit for bit the
weights of a hand-written mean-loss loop; it steps the optimizer and
scheduler once per group of batches, clips the update to ``clip_norm``,
stops on a non-finite loss, and checks its arguments before it changes
anything. ``TrainOptions`` is frozen. Some tests drive the step through
``train_epoch``, as the loop calls it."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    PAD,
    random_batch,
    random_tokens,
    same_parameters,
    tiny_model,
)
from conftest import VOCAB as V
from torch import nn

from transformer_lite.training import (
    Batch,
    Examples,
    History,
    LabelSmoothingLoss,
    TrainOptions,
    noam_lr,
    noam_scheduler,
    seq2seq_loss,
    supervised_loss,
    train_epoch,
    train_step,
)

SEQ2SEQ = seq2seq_loss(LabelSmoothingLoss(V, PAD, reduction="sum"))
CROSS_ENTROPY = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
NO_CLIP = TrainOptions(clip_norm=None, progress=False)


def test_accumulating_two_batches_equals_one_big_batch():
    """The halves hold different numbers of real tokens, so the losses
    must be weighted by tokens, not simply divided by `accumulate`."""
    src = random_tokens(6, 7, seed=10)
    tgt = random_tokens(6, 6, seed=11)
    tgt[:2, 3:] = PAD  # the first half is shorter
    whole = Batch(src, tgt, PAD)
    halves = [Batch(src[:3], tgt[:3], PAD), Batch(src[3:], tgt[3:], PAD)]
    assert halves[0].n_tokens != halves[1].n_tokens
    losses, models = [], []
    for batches, accumulate in (([whole], 1), (halves, 2)):
        model = tiny_model(dtype=torch.float64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        options = TrainOptions(
            clip_norm=None, accumulate=accumulate, progress=False
        )
        losses.append(
            train_epoch(model, batches, SEQ2SEQ, optimizer, options=options)
        )
        models.append(model)
    assert not same_parameters(models[0], tiny_model(dtype=torch.float64))
    assert same_parameters(*models, atol=1e-12)
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)


def classifier(seed: int = 0) -> nn.Module:
    """(B, 4) features -> (B, V) scores, in float64."""
    torch.manual_seed(seed)
    return nn.Linear(4, V, dtype=torch.float64)


def test_a_step_on_examples_equals_a_hand_written_step():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (6,), generator=g)
    model, reference = classifier(), classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = train_step(
        model, Examples(x, y), CROSS_ENTROPY, optimizer, options=NO_CLIP
    )
    # the same step written out: the mean cross-entropy, one SGD step
    expected = F.cross_entropy(reference(x), y)
    expected.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.5 * p.grad
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    assert not same_parameters(model, classifier())  # it did step
    assert same_parameters(model, reference, atol=1e-12)


def tagger(seed: int = 0) -> nn.Module:
    """(B, T) ids -> (B, T, V) scores, in float64: a prediction at every
    place, as a language model makes."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(V, 8), nn.Linear(8, V)).double()


def test_accumulating_two_examples_batches_equals_one_big_batch():
    ids = random_tokens(6, 5, seed=20)
    targets = random_tokens(6, 5, seed=21)
    targets[:3, 2:] = PAD  # the first half holds fewer targets
    whole = Examples(ids, targets, ignore_index=PAD)
    halves = [
        Examples(ids[:3], targets[:3], ignore_index=PAD),
        Examples(ids[3:], targets[3:], ignore_index=PAD),
    ]
    assert halves[0].n_tokens != halves[1].n_tokens
    objective = supervised_loss(
        nn.CrossEntropyLoss(reduction="sum", ignore_index=PAD)
    )
    models, losses = [tagger(), tagger()], []
    for model, batches in zip(models, (whole, halves), strict=True):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses.append(
            train_step(model, batches, objective, optimizer, options=NO_CLIP)
        )
    assert not same_parameters(models[0], tagger())
    assert same_parameters(*models, atol=1e-12)
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)


def train_both_ways(smoothing: float, ignore_index: int | None):
    """A few float32 Adam steps of ``tagger`` on four padded batches:
    by ``train_step`` (a sum, divided by the token count) and by a
    hand-written loop on ``F.cross_entropy``'s mean; the two models."""
    batches = [
        (random_tokens(3, 6, seed=s), random_tokens(3, 6, seed=s + 50))
        for s in range(4)
    ]  # without ignore_index, PAD is a class like any other
    keep = {} if ignore_index is None else {"ignore_index": ignore_index}
    objective = supervised_loss(
        nn.CrossEntropyLoss(reduction="sum", label_smoothing=smoothing, **keep)
    )
    model, reference = tagger().float(), tagger().float()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for ids, targets in batches:
        loss = train_step(
            model,
            Examples(ids, targets, ignore_index),
            objective,
            optimizer,
            options=NO_CLIP,
        )
        ref_optimizer.zero_grad()
        mean = F.cross_entropy(
            reference(ids).flatten(0, 1),
            targets.flatten(),
            label_smoothing=smoothing,
            **keep,
        )
        mean.backward()
        ref_optimizer.step()
        assert loss == pytest.approx(mean.item(), rel=1e-6)
    assert not same_parameters(model, tagger().float())  # they trained
    return model, reference


@pytest.mark.parametrize("ignore_index", [None, PAD], ids=["all", "padded"])
def test_the_step_trains_bit_for_bit_like_a_mean_loss_loop(ignore_index):
    """The chapters replaced their own loops (``F.cross_entropy``, a mean,
    then ``backward``) by ``fit``: a sum times 1 / N gives the very same
    float32 gradients as the mean, so the same weights, bit for bit."""
    model, reference = train_both_ways(0.0, ignore_index)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("ignore_index", [None, PAD], ids=["all", "padded"])
def test_a_label_smoothed_step_trains_within_rounding_of_a_mean_loop(
    ignore_index,
):
    """With label smoothing PyTorch's mean divides each of its two terms
    (the true class's and the spread's) by N, where the step scales
    their sum: the gradients differ in the last bits, not more."""
    model, reference = train_both_ways(0.1, ignore_index)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_optimizer_and_scheduler_step_once_per_group():
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = noam_scheduler(optimizer, 16, warmup=3)
    history = History()
    batches = [random_batch(seed=s) for s in range(5)]
    train_epoch(
        model,
        batches,
        SEQ2SEQ,
        optimizer,
        scheduler=scheduler,
        options=TrainOptions(accumulate=2, progress=False),
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
    train_step(
        model,
        random_batch(),
        SEQ2SEQ,
        optimizer,
        options=TrainOptions(clip_norm=clip_norm),
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


def test_non_finite_loss_stops_training_before_the_optimizer_steps():
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    nan_loss = seq2seq_loss(lambda logits, targets: logits.sum() * math.nan)
    with pytest.raises(FloatingPointError, match="loss is nan"):
        train_step(
            model,
            random_batch(),
            nan_loss,
            torch.optim.Adam(model.parameters()),
        )
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
        assert p.grad is None  # cleared


@pytest.mark.parametrize(
    "place, match",
    [
        (1, r"tgt holds token ids .*\[0, 10\]"),  # the model reads it
        (-1, r"targets holds token ids .*\[0, 10\]"),  # only the loss
    ],
)
def test_ids_outside_the_vocabulary_stop_the_step_before_it_steps(
    place, match
):
    """The step reads no ids itself: the model checks what it reads
    (``tgt_in``), the loss the last target token, which only it sees;
    both for free while the batch is on the CPU. The error reaches the
    caller before the optimizer has moved anything."""
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    bad = random_batch()
    bad.tgt[0, place] = V  # one past the vocabulary
    bad = Batch(bad.src, bad.tgt, PAD)
    with pytest.raises(ValueError, match=match):
        train_step(
            model, bad, SEQ2SEQ, torch.optim.SGD(model.parameters(), lr=0.1)
        )
    assert all(
        torch.equal(p, b)
        for p, b in zip(model.parameters(), before, strict=True)
    )


def test_a_batch_without_targets_to_learn_from_is_refused():
    model = classifier()
    nothing = Examples(torch.zeros(2, 4).double(), torch.zeros(2).long(), 0)
    assert nothing.n_tokens == 0
    with pytest.raises(ValueError, match="no target tokens"):
        train_step(
            model,
            nothing,
            CROSS_ENTROPY,
            torch.optim.SGD(model.parameters(), lr=0.1),
        )


def _step_with(**changes):
    """train_step on a classifier, with one argument replaced."""
    model = classifier()
    arguments = dict(
        model=model,
        batches=Examples(torch.zeros(2, 4, dtype=torch.float64),
                         torch.ones(2).long()),
        objective=CROSS_ENTROPY,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    )  # fmt: skip
    options = changes.pop("options", None)
    arguments.update(changes)
    return train_step(*arguments.values(), options=options)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(model=lambda x: x), "model must be an nn.Module"),
        (dict(optimizer="sgd"), "optimizer must be an Optimizer"),
        (dict(objective=None), r"objective must be .*seq2seq_loss"),
        (dict(options=dict(clip_norm=None)), "options must be TrainOptions"),
        (dict(batches=[]), "batches must be a batch"),
        (dict(batches=[torch.zeros(2, 4)]), r"batches .*\['Tensor'\]"),
        (
            dict(options=TrainOptions(amp_dtype=torch.float16)),
            "on cpu use amp_dtype=torch.bfloat16",
        ),
    ],
)
def test_train_step_checks_its_arguments(changes, match):
    with pytest.raises(ValueError, match=match):
        _step_with(**changes)


def test_train_options_are_frozen():
    """Checked once when built: they cannot change afterwards."""
    options = TrainOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.clip_norm = math.inf
    assert options == TrainOptions(1.0, 1, None, True)  # the defaults
