"""Tests for transformer_lite.training.loop (chapters 6, 10 and 11):
``train_epoch`` reports the token-weighted mean loss (equal to
``evaluate``'s at lr 0), ``fit`` takes a callable for fresh batches (of
``Examples`` too), validates in eval mode without gradients, stops early
with the best weights restored (those of one epoch's training), stops
after ``max_steps`` even within an epoch or an endless stream, calls
``on_step`` after every step, and the progress bar shows only where a
person watches (``training.progress``)."""

import itertools

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
from torch import nn

from transformer_lite.training import (
    Batch,
    Examples,
    LabelSmoothingLoss,
    TrainOptions,
    evaluate,
    fit,
    progress,
    seq2seq_loss,
    supervised_loss,
    train_epoch,
)

SEQ2SEQ = seq2seq_loss(LabelSmoothingLoss(V, PAD, reduction="sum"))
QUIET = TrainOptions(progress=False)


def test_epoch_loss_is_the_token_weighted_mean():
    """With lr = 0 nothing changes, so the epoch's loss must equal the
    evaluation loss: the mean over all real target tokens."""
    model = tiny_model()
    batches = [random_batch(rows=r, seed=r) for r in (2, 5, 3)]
    loss_fn = LabelSmoothingLoss(V, PAD, reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    objective = seq2seq_loss(loss_fn)
    trained = train_epoch(model, batches, objective, optimizer, options=QUIET)
    with torch.no_grad():
        per_batch = [
            loss_fn(model(b.src, b.tgt_in), b.tgt_out).item() for b in batches
        ]
    expected = sum(per_batch) / sum(b.n_tokens for b in batches)
    assert trained == pytest.approx(expected, rel=1e-6)
    assert evaluate(model, batches, objective) == pytest.approx(expected)


def test_batches_may_be_a_callable_but_not_a_spent_generator():
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())

    def fresh():
        return (random_batch(seed=s) for s in range(3))

    history = fit(model, fresh, SEQ2SEQ, optimizer, epochs=2, options=QUIET)
    assert len(history.step_loss) == 6
    with pytest.raises(ValueError, match="callable"):
        fit(model, fresh(), SEQ2SEQ, optimizer, epochs=2, options=QUIET)


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
        SEQ2SEQ,
        torch.optim.Adam(model.parameters()),
        epochs=2,
        val_batches=val,
        options=QUIET,
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

    def run(epochs, patience):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, fit(
            model,
            train,
            SEQ2SEQ,
            optimizer,
            epochs=epochs,
            val_batches=val,
            patience=patience,
            options=QUIET,
        )

    model, history = run(epochs=10, patience=2)
    assert history.val_loss[1] > history.val_loss[0]
    assert history.stopped_early and history.best_epoch == 0
    assert len(history.val_loss) == 3
    after_one_epoch, _ = run(epochs=1, patience=None)
    assert same_parameters(model, after_one_epoch)
    assert evaluate(model, val, SEQ2SEQ) == pytest.approx(history.val_loss[0])


def test_fit_rejects_patience_without_validation():
    model = tiny_model()
    with pytest.raises(ValueError, match="patience"):
        fit(
            model,
            [random_batch()],
            SEQ2SEQ,
            torch.optim.Adam(model.parameters()),
            patience=2,
        )


def test_progress_bar_shows_only_when_asked_and_watched(capsys, monkeypatch):
    """A bar only where a person watches: never in a log (carriage
    returns), even when asked for."""
    model = tiny_model()
    args = ([random_batch()], SEQ2SEQ, torch.optim.Adam(model.parameters()))
    shown = TrainOptions(progress=True)
    train_epoch(model, *args, options=QUIET)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: False)
    train_epoch(model, *args, options=shown)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "watched", lambda: True)
    train_epoch(model, *args, options=shown)
    assert "train" in capsys.readouterr().err
    train_epoch(model, *args, options=QUIET)
    assert capsys.readouterr().err == ""
    train_epoch(model, *args)  # by default, shown
    assert "train" in capsys.readouterr().err


def test_not_watched_when_stderr_is_a_file(monkeypatch, tmp_path):
    with open(tmp_path / "log", "w") as log:
        monkeypatch.setattr("sys.stderr", log)
        assert not progress.watched()


# ----------------------------------------------------------------------------
# max_steps, on_step, and batches of Examples


def adam_steps(optimizer) -> set[int]:
    """The step counts of Adam's state: the optimizer steps taken."""
    return {int(s["step"]) for s in optimizer.state.values()}


@pytest.mark.parametrize(
    "n_batches, epochs, max_steps, epochs_run",
    [
        (5, 3, 3, 1),  # stopped within the first epoch
        (2, 10, 5, 3),  # 2 + 2 + 1 steps: counted over the epochs
    ],
)
def test_fit_stops_after_max_steps(n_batches, epochs, max_steps, epochs_run):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    batches = [random_batch(seed=s) for s in range(n_batches)]
    history = fit(
        model, batches, SEQ2SEQ, optimizer, epochs=epochs,
        max_steps=max_steps, options=QUIET,
    )  # fmt: skip
    assert len(history.step_loss) == len(history.lr) == max_steps
    assert len(history.train_loss) == epochs_run
    assert adam_steps(optimizer) == {max_steps}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_fit_stops_a_never_ending_stream_after_max_steps(accumulate):
    model = tiny_model()
    drawn = []

    def endless():
        for s in itertools.count():
            drawn.append(s)
            yield random_batch(seed=s)

    history = fit(
        model, endless(), SEQ2SEQ, torch.optim.Adam(model.parameters()),
        epochs=1, max_steps=4,
        options=TrainOptions(accumulate=accumulate, progress=False),
    )  # fmt: skip
    assert len(history.step_loss) == 4
    assert len(drawn) == 4 * accumulate  # not one batch more


def test_on_step_is_called_after_every_step_with_its_loss():
    """Called once the optimizer has stepped: a callback that saves a
    checkpoint saves the weights of that step."""
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    calls = []

    def on_step(steps_done, loss):
        calls.append((steps_done, loss, adam_steps(optimizer)))

    batches = [random_batch(seed=s) for s in range(3)]
    history = fit(
        model, batches, SEQ2SEQ, optimizer, epochs=2, max_steps=5,
        options=QUIET, on_step=on_step,
    )  # fmt: skip
    assert [steps for steps, _, _ in calls] == [1, 2, 3, 4, 5]
    assert [loss for _, loss, _ in calls] == history.step_loss
    assert [stepped for _, _, stepped in calls] == [{k} for k in range(1, 6)]


def test_fit_trains_on_fresh_examples_every_epoch():
    """A classifier's batches, drawn anew for each epoch by a callable,
    as chapter 11 draws shifted images."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    centres = 3 * torch.eye(3, 4)  # class k sits around centres[k]
    epochs_drawn = []

    def one_epoch():
        g = torch.Generator().manual_seed(len(epochs_drawn))
        epochs_drawn.append(len(epochs_drawn))
        for _ in range(4):
            labels = torch.randint(0, 3, (8,), generator=g)
            x = centres[labels] + 0.3 * torch.randn(8, 4, generator=g)
            yield Examples(x, labels)

    objective = supervised_loss(nn.CrossEntropyLoss(reduction="sum"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    history = fit(
        model, one_epoch, objective, optimizer, epochs=5, options=QUIET
    )
    assert epochs_drawn == [0, 1, 2, 3, 4]
    assert len(history.step_loss) == 20
    assert history.train_loss[-1] < 0.5 * history.train_loss[0]
