"""Tests for transformer_lite.training.objectives (chapters 6, 10 and
11): ``seq2seq_loss`` is the teacher-forcing loss of a translator,
``supervised_loss`` the summed cross-entropy of a model called on its
inputs, whatever the shape of its predictions, and both refuse a loss
that averages, when they are built."""

import pytest
import torch
import torch.nn.functional as F
from conftest import PAD, random_batch, tiny_model
from conftest import VOCAB as V
from torch import nn

from transformer_lite.training import (
    Examples,
    LabelSmoothingLoss,
    seq2seq_loss,
    supervised_loss,
)
from transformer_lite.training.objectives import check_sum_loss


def test_seq2seq_loss_is_the_teacher_forcing_loss():
    """Written out: the decoder reads all but the last target token and
    is scored on all but the first, padding left out."""
    model = tiny_model(dtype=torch.float64).eval()
    batch = random_batch(rows=3, seed=4)
    objective = seq2seq_loss(LabelSmoothingLoss(V, PAD, 0.0, reduction="sum"))
    with torch.no_grad():
        ours = objective(model, batch)
        logits = model(batch.src, batch.tgt[:, :-1])  # (B, T, V)
        expected = F.cross_entropy(
            logits.flatten(0, 1),
            batch.tgt[:, 1:].flatten(),
            ignore_index=PAD,
            reduction="sum",
        )
    assert ours.dim() == 0
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


class Tagger(nn.Module):
    """(B, T) ids -> (B, T, V) scores: a prediction at every place."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, V, dtype=torch.float64)

    def forward(self, ids):
        return self.embed(ids)


def classifier() -> nn.Module:
    """(B, 4) features -> (B, V) scores: one prediction per example."""
    torch.manual_seed(0)
    return nn.Linear(4, V, dtype=torch.float64)


def test_supervised_loss_flattens_a_prediction_per_place():
    torch.manual_seed(0)
    model = Tagger()
    ids = torch.randint(0, V, (3, 5))
    targets = torch.randint(0, V, (3, 5))
    objective = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
    loss = objective(model, Examples(ids, targets))
    expected = F.cross_entropy(
        model(ids).reshape(15, V), targets.reshape(15), reduction="sum"
    )
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_supervised_loss_takes_a_label_per_example():
    model = classifier()
    x = torch.randn(6, 4, dtype=torch.float64)
    targets = torch.randint(0, V, (6,))
    objective = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
    loss = objective(model, Examples(x, targets))
    expected = F.cross_entropy(model(x), targets, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_supervised_loss_leaves_out_the_ignored_targets():
    torch.manual_seed(0)
    model = Tagger()
    ids = torch.randint(1, V, (2, 4))
    targets = torch.randint(1, V, (2, 4))
    targets[0, 2:] = PAD
    loss_fn = nn.CrossEntropyLoss(reduction="sum", ignore_index=PAD)
    loss = supervised_loss(loss_fn)(model, Examples(ids, targets, PAD))
    kept = targets != PAD
    expected = F.cross_entropy(
        model(ids)[kept], targets[kept], reduction="sum"
    )
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


class TwoInputs(nn.Module):
    """Scores that depend on which input comes first."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, V, dtype=torch.float64)
        self.b = nn.Linear(2, V, dtype=torch.float64)

    def forward(self, first, second):
        return self.a(first) + 2 * self.b(second)


def test_supervised_loss_calls_the_model_on_its_inputs_in_order():
    model = TwoInputs()
    first = torch.randn(3, 4, dtype=torch.float64)
    second = torch.randn(3, 2, dtype=torch.float64)
    targets = torch.randint(0, V, (3,))
    objective = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
    loss = objective(model, Examples((first, second), targets))
    expected = F.cross_entropy(model(first, second), targets, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "make, loss_fn",
    [
        (seq2seq_loss, LabelSmoothingLoss(V, PAD)),  # mean by default
        (supervised_loss, nn.CrossEntropyLoss()),
        (supervised_loss, nn.CrossEntropyLoss(reduction="none")),
    ],
)
def test_an_averaging_loss_is_refused_when_the_objective_is_built(
    make, loss_fn
):
    """A mean would be divided by the token count twice, in the step."""
    with pytest.raises(ValueError, match=r"reduction='sum'"):
        make(loss_fn)


@pytest.mark.parametrize("make", [seq2seq_loss, supervised_loss])
def test_a_loss_that_is_not_a_function_is_refused(make):
    with pytest.raises(ValueError, match="loss_fn must be callable"):
        make("cross_entropy")


def test_a_plain_function_counts_as_summing():
    """A function has no ``reduction`` to read: it is trusted to sum."""
    check_sum_loss(lambda logits, targets: logits.sum())
    check_sum_loss(nn.CrossEntropyLoss(reduction="sum"))
