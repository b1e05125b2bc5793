"""The training loop, for every model (chapters 6, 7, 10 and 11): epochs
of the one step (:func:`~transformer_lite.training.step.train_step`),
validation and early stopping, a callback after each step, a progress
bar. What differs between models is the batch and the objective
(:mod:`~transformer_lite.training.objectives`), not the loop.
"""

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.checks import check_int
from transformer_lite.device import evaluating, module_device
from transformer_lite.training.objectives import Objective
from transformer_lite.training.progress import progress_bar
from transformer_lite.training.step import TrainOptions, check_step, take_step

__all__ = ["History", "evaluate", "fit", "train_epoch"]

Batches = Iterable[Any] | Callable[[], Iterable[Any]]
OnStep = Callable[[int, float], None]  # (steps done, that step's loss)


@dataclass
class History:
    """What :func:`fit` measured; ``to_dict()`` gives plain data."""

    step_loss: list[float] = field(default_factory=list)  # per opt. step
    lr: list[float] = field(default_factory=list)  # lr of each opt. step
    train_loss: list[float] = field(default_factory=list)  # per epoch
    val_loss: list[float] = field(default_factory=list)  # per epoch
    best_epoch: int | None = None  # index of the lowest val_loss
    stopped_early: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _fresh(batches: Batches) -> Iterable[Any]:
    return batches() if callable(batches) else batches


def _groups(batches: Iterable[Any], size: int) -> Iterator[list[Any]]:
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _n_steps(batches: Batches, accumulate: int) -> int | None:
    if callable(batches) or not hasattr(batches, "__len__"):
        return None
    return math.ceil(len(batches) / accumulate)


@dataclass
class _Run:
    """One training run's checked arguments and its step count."""

    model: nn.Module
    objective: Objective
    optimizer: Optimizer
    scheduler: LRScheduler | None
    options: TrainOptions
    scaler: torch.amp.GradScaler
    history: History | None
    on_step: OnStep | None = None
    max_steps: int | None = None
    steps: int = 0

    def done(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps


def _run(model, objective, optimizer, scheduler, options, scaler, history,
         on_step=None, max_steps=None) -> _Run:  # fmt: skip
    """The arguments of :func:`fit` and :func:`train_epoch`, checked once
    for the whole run."""
    options = TrainOptions() if options is None else options
    scaler = check_step(model, objective, optimizer, options, scaler)
    if on_step is not None and not callable(on_step):
        raise ValueError(f"on_step must be callable, got {on_step!r}")
    if max_steps is not None:
        check_int("max_steps", max_steps, low=1)
    return _Run(model, objective, optimizer, scheduler, options, scaler,
                history, on_step, max_steps)  # fmt: skip


def _epoch(run: _Run, batches: Iterable[Any], bar) -> float:
    """Steps over ``batches`` (groups of ``accumulate``), reporting to
    ``bar``; the mean loss per target token."""
    total_loss, total_tokens = 0.0, 0
    for group in _groups(batches, run.options.accumulate):
        n_tokens = sum(batch.n_tokens for batch in group)
        if n_tokens == 0:
            continue  # nothing to learn from
        lr = run.optimizer.param_groups[0]["lr"]
        loss = take_step(run.model, group, run.objective, run.optimizer,
                         run.scheduler, run.options, run.scaler)  # fmt: skip
        run.steps += 1
        total_loss += loss * n_tokens
        total_tokens += n_tokens
        if run.history is not None:
            run.history.step_loss.append(loss)
            run.history.lr.append(lr)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
        bar.update()
        if run.on_step is not None:
            run.on_step(run.steps, loss)
        if run.done():
            break
    if total_tokens == 0:
        raise ValueError(
            "batches yielded no target tokens; for several epochs pass a "
            "list, or a callable returning a fresh iterable"
        )
    return total_loss / total_tokens


def train_epoch(
    model: nn.Module,
    batches: Batches,
    objective: Objective,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    options: TrainOptions | None = None,
    scaler: torch.amp.GradScaler | None = None,
    history: History | None = None,
) -> float:
    """One pass over ``batches``: a training step on every
    ``options.accumulate`` consecutive batches (a last, shorter group
    also steps). Batches without target tokens are skipped.

    Args:
        batches: an iterable of batches (:class:`Batch`,
            :class:`Examples`), or a callable returning one; each batch
            is moved to the model's device.
        objective, scheduler, options, scaler: as
            :func:`~transformer_lite.training.step.train_step`.
        history: if given, gets each step's loss and learning rate (of
            the first parameter group).

    Returns:
        the mean training loss per target token.
    """
    run = _run(model, objective, optimizer, scheduler, options, scaler,
               history)  # fmt: skip
    steps = _n_steps(batches, run.options.accumulate)
    with progress_bar(steps, "train", run.options.progress) as bar:
        return _epoch(run, _fresh(batches), bar)


def evaluate(
    model: nn.Module, batches: Batches, objective: Objective
) -> float:
    """Mean loss per target token, in eval mode without gradients (the
    model's mode is restored afterwards). ``objective`` returns a sum,
    as for :func:`~transformer_lite.training.step.train_step`."""
    if not callable(objective):
        raise ValueError(f"objective must be callable, got {objective!r}")
    device = module_device(model)
    total_loss, total_tokens = 0.0, 0
    with evaluating(model):
        for batch in _fresh(batches):
            total_loss += float(objective(model, batch.to(device)))
            total_tokens += batch.n_tokens
    if total_tokens == 0:
        raise ValueError("validation batches yielded no target tokens")
    return total_loss / total_tokens


def _check_patience(patience: int | None, val_batches) -> None:
    if patience is not None and (
        val_batches is None
        or isinstance(patience, bool)
        or not isinstance(patience, int)
        or patience < 1
    ):
        raise ValueError(
            f"patience must be an int >= 1 and needs val_batches, got "
            f"patience={patience!r}"
        )


def _copy_state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fit(
    model: nn.Module,
    train_batches: Batches,
    objective: Objective,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    epochs: int = 10,
    max_steps: int | None = None,
    val_batches: Batches | None = None,
    patience: int | None = None,
    options: TrainOptions | None = None,
    scaler: torch.amp.GradScaler | None = None,
    on_step: OnStep | None = None,
) -> History:
    """Train for ``epochs`` epochs (as :func:`train_epoch`), validating
    after each one when ``val_batches`` is given (:func:`evaluate`).

    Early stopping: with ``patience`` p, training stops after p epochs in a
    row without a lower validation loss, and the weights of the best epoch
    are loaded back at the end, whether or not it stopped early (the
    optimizer and scheduler keep their latest state). One progress bar
    counts the optimizer steps of all epochs.

    Args:
        train_batches: an iterable of batches, or a callable returning a
            fresh one for each epoch (an iterator serves one epoch).
        objective: (model, batch) -> the summed loss
            (:mod:`~transformer_lite.training.objectives`).
        max_steps: stop after this many optimizer steps, even within an
            epoch (for a stream of batches that does not end).
        options: :class:`~transformer_lite.training.step.TrainOptions`,
            checked once for the run; None: the defaults.
        on_step: called as ``on_step(steps_done, loss)`` after every
            step: to evaluate or save every so many steps.

    Returns:
        a :class:`History`; ``best_epoch`` indexes ``val_loss``.
    """
    history = History()
    run = _run(model, objective, optimizer, scheduler, options, scaler,
               history, on_step, max_steps)  # fmt: skip
    check_int("epochs", epochs, low=1)
    _check_patience(patience, val_batches)
    steps = _n_steps(train_batches, run.options.accumulate)
    total = max_steps or (steps and steps * epochs)
    best_state = None
    with progress_bar(total, "fit", run.options.progress) as bar:
        for epoch in range(epochs):
            bar.set_description(f"epoch {epoch + 1}/{epochs}")
            history.train_loss.append(_epoch(run, _fresh(train_batches), bar))
            if val_batches is not None:
                history.val_loss.append(
                    evaluate(model, val_batches, objective)
                )
                if history.best_epoch is None or history.val_loss[-1] < min(
                    history.val_loss[:-1]
                ):
                    history.best_epoch = epoch
                    if patience is not None:
                        best_state = _copy_state(model)
                elif patience and epoch - history.best_epoch >= patience:
                    history.stopped_early = True
                    break
            if run.done():
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return history
