"""Tests for transformer_lite.training.loop (chapter 6): ``train_epoch``
reports the token-weighted mean loss (equal to ``evaluate``'s at lr 0),
``fit`` takes a callable for fresh batches, validates in eval mode
without gradients and stops early with the best weights restored (those
of one epoch's training), and the progress bar shows only where a person
watches (``training.progress``)."""

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
    LabelSmoothingLoss,
    evaluate,
    fit,
    progress,
    train_epoch,
)


def test_epoch_loss_is_the_token_weighted_mean():
    """With lr = 0 nothing changes, so the epoch's loss must equal the
    evaluation loss: the mean over all real target tokens."""
    model = tiny_model()
    batches = [random_batch(rows=r, seed=r) for r in (2, 5, 3)]
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trained = train_epoch(model, batches, loss_fn, optimizer, progress=False)
    with torch.no_grad():
        per_batch = [
            loss_fn(model(b.src, b.tgt_in), b.tgt_out).item() for b in batches
        ]
    expected = sum(per_batch) / sum(b.n_tokens for b in batches)
    assert trained == pytest.approx(expected, rel=1e-6)
    assert evaluate(model, batches, loss_fn) == pytest.approx(expected)


def test_batches_may_be_a_callable_but_not_a_spent_generator():
    model = tiny_model()
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    optimizer = torch.optim.Adam(model.parameters())

    def fresh():
        return (random_batch(seed=s) for s in range(3))

    history = fit(model, fresh, loss_fn, optimizer, epochs=2, progress=False)
    assert len(history.step_loss) == 6
    with pytest.raises(ValueError, match="callable"):
        fit(model, fresh(), loss_fn, optimizer, epochs=2, progress=False)


def test_validation_runs_without_gradients_in_eval_mode():
    model = tiny_model()
    seen = []
    model.register_forward_hook(
        lambda module, args, out: seen.append(
            (args[0].size(0), module.training, torch.is_grad_enabled())
        )
    )
    train = [random_batch(rows=4, seed=s) for s in range(2)]
    val = [random_batch(rows=3, seed=9)]
    history = fit(
        model,
        train,
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        torch.optim.Adam(model.parameters()),
        epochs=2,
        val_batches=val,
        progress=False,
    )
    assert set(seen) == {(4, True, True), (3, False, False)}
    assert model.training
    assert len(history.train_loss) == len(history.val_loss) == 2
    assert not history.stopped_early


def test_early_stopping_restores_the_best_weights():
    """Training pushes towards token 5, validation wants token 6: the
    validation loss rises after the first epoch."""
    src = random_tokens(8, 7, seed=12, min_len=7)
    train = [Batch(src, torch.full((8, 5), 5), PAD)]
    val = [Batch(src, torch.full((8, 5), 6), PAD)]
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")

    def run(epochs, patience):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, fit(
            model,
            train,
            loss_fn,
            optimizer,
            epochs=epochs,
            val_batches=val,
            patience=patience,
            progress=False,
        )

    model, history = run(epochs=10, patience=2)
    assert history.val_loss[1] > history.val_loss[0]
    assert history.stopped_early and history.best_epoch == 0
    assert len(history.val_loss) == 3
    after_one_epoch, _ = run(epochs=1, patience=None)
    assert same_parameters(model, after_one_epoch)
    assert evaluate(model, val, loss_fn) == pytest.approx(history.val_loss[0])


def test_fit_rejects_patience_without_validation():
    model = tiny_model()
    with pytest.raises(ValueError, match="patience"):
        fit(
            model,
            [random_batch()],
            LabelSmoothingLoss(V, PAD, reduction="sum"),
            torch.optim.Adam(model.parameters()),
            patience=2,
        )


def test_progress_bar_shows_only_when_asked_and_watched(capsys, monkeypatch):
    """A bar only where a person watches: never in a log (carriage
    returns), even when asked for."""
    model = tiny_model()
    args = (
        [random_batch()],
        LabelSmoothingLoss(V, PAD, reduction="sum"),
        torch.optim.Adam(model.parameters()),
    )
    train_epoch(model, *args, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: False)
    train_epoch(model, *args, progress=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: True)
    train_epoch(model, *args, progress=True)
    assert "train" in capsys.readouterr().err


def test_not_watched_when_stderr_is_a_file(monkeypatch, tmp_path):
    with open(tmp_path / "log", "w") as log:
        monkeypatch.setattr("sys.stderr", log)
        assert not progress.watched()
