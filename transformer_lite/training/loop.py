"""The training loop (chapter 6): epochs of :func:`train_step`, validation
and early stopping, with a progress bar.
"""

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.checks import check_bool, check_int
from transformer_lite.device import evaluating, module_device
from transformer_lite.training.batch import Batch
from transformer_lite.training.progress import progress_bar
from transformer_lite.training.step import (
    LossFn,
    check_amp,
    check_clip_norm,
    check_sum_loss,
    train_step,
)

__all__ = ["History", "evaluate", "fit", "train_epoch"]

Batches = Iterable[Batch] | Callable[[], Iterable[Batch]]


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


def _fresh(batches: Batches) -> Iterable[Batch]:
    return batches() if callable(batches) else batches


def _groups(batches: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _n_steps(batches: Iterable[Batch], accumulate: int) -> int | None:
    if not hasattr(batches, "__len__"):
        return None
    return math.ceil(len(batches) / accumulate)


def _check_options(model, optimizer, loss_fn, *, accumulate, clip_norm,
                   amp_dtype, progress) -> None:  # fmt: skip
    """The options :func:`fit` and :func:`train_epoch` share, checked
    before the first step (``loss_fn`` must return a sum)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model)}")
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be an Optimizer: {optimizer!r}")
    check_int("accumulate", accumulate, low=1)
    check_clip_norm(clip_norm)
    check_amp(module_device(model), amp_dtype)
    check_bool("progress", progress)
    check_sum_loss(loss_fn)


def _step_options(
    scheduler: LRScheduler | None,
    clip_norm: float | None,
    amp_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None,
) -> dict:
    """The keyword options :func:`train_step` takes from the loop."""
    return dict(
        scheduler=scheduler,
        clip_norm=clip_norm,
        amp_dtype=amp_dtype,
        scaler=scaler,
    )


def _epoch(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_fn: LossFn,
    optimizer: Optimizer,
    bar,
    history: History | None,
    accumulate: int,
    **step_options,
) -> float:
    """Steps over ``batches``, reporting to ``bar``; the mean loss."""
    total_loss, total_tokens = 0.0, 0
    for group in _groups(batches, accumulate):
        n_tokens = sum(batch.n_tokens for batch in group)
        if n_tokens == 0:
            continue  # nothing to learn from
        lr = optimizer.param_groups[0]["lr"]
        loss = train_step(model, group, loss_fn, optimizer, **step_options)
        total_loss += loss * n_tokens
        total_tokens += n_tokens
        if history is not None:
            history.step_loss.append(loss)
            history.lr.append(lr)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
        bar.update()
    if total_tokens == 0:
        raise ValueError(
            "batches yielded no target tokens; for several epochs pass a "
            "list, or a callable returning a fresh iterable"
        )
    return total_loss / total_tokens


def train_epoch(
    model: nn.Module,
    batches: Batches,
    loss_fn: LossFn,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    clip_norm: float | None = 1.0,
    accumulate: int = 1,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    progress: bool = True,
    history: History | None = None,
) -> float:
    """One pass over ``batches``: a :func:`train_step` on every
    ``accumulate`` consecutive batches (a last, shorter group also
    steps). Batches without target tokens are skipped.

    Args:
        batches: an iterable of :class:`Batch`, or a callable returning
            one; each batch is moved to the model's device.
        loss_fn, scheduler, clip_norm, amp_dtype, scaler: as
            :func:`train_step` (``loss_fn`` returns a sum).
        progress: show a progress bar where someone watches.
        history: if given, gets each step's loss and learning rate (of
            the first parameter group).

    Returns:
        the mean training loss per non-pad target token.
    """
    _check_options(
        model,
        optimizer,
        loss_fn,
        accumulate=accumulate,
        clip_norm=clip_norm,
        amp_dtype=amp_dtype,
        progress=progress,
    )
    batches = _fresh(batches)
    steps = _n_steps(batches, accumulate)
    options = _step_options(scheduler, clip_norm, amp_dtype, scaler)
    with progress_bar(steps, "train", progress) as bar:
        return _epoch(
            model,
            batches,
            loss_fn,
            optimizer,
            bar,
            history,
            accumulate,
            **options,
        )


def evaluate(model: nn.Module, batches: Batches, loss_fn: LossFn) -> float:
    """Mean loss per non-pad target token, in eval mode without gradients
    (the model's mode is restored afterwards). ``loss_fn`` returns a sum,
    as for :func:`train_step`."""
    check_sum_loss(loss_fn)
    device = module_device(model)
    total_loss, total_tokens = 0.0, 0
    with evaluating(model):
        for batch in _fresh(batches):
            batch = batch.to(device)
            logits = model(
                batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask
            )  # (B, T, V)
            total_loss += float(loss_fn(logits, batch.tgt_out))
            total_tokens += batch.n_tokens
    if total_tokens == 0:
        raise ValueError("validation batches yielded no target tokens")
    return total_loss / total_tokens


def fit(
    model: nn.Module,
    train_batches: Batches,
    loss_fn: LossFn,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    epochs: int = 10,
    val_batches: Batches | None = None,
    patience: int | None = None,
    clip_norm: float | None = 1.0,
    accumulate: int = 1,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    progress: bool = True,
) -> History:
    """Train for ``epochs`` epochs (as :func:`train_epoch`), validating
    after each one when ``val_batches`` is given (:func:`evaluate`).

    Early stopping: with ``patience`` p, training stops after p epochs in a
    row without a lower validation loss, and the weights of the best epoch
    are loaded back at the end, whether or not it stopped early (the
    optimizer and scheduler keep their latest state). One progress bar
    counts the optimizer steps of all epochs.

    Returns:
        a :class:`History`; ``best_epoch`` indexes ``val_loss``.
    """
    _check_options(
        model,
        optimizer,
        loss_fn,
        accumulate=accumulate,
        clip_norm=clip_norm,
        amp_dtype=amp_dtype,
        progress=progress,
    )
    check_int("epochs", epochs, low=1)
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
    steps = (
        None
        if callable(train_batches)
        else _n_steps(train_batches, accumulate)
    )
    options = _step_options(scheduler, clip_norm, amp_dtype, scaler)
    history = History()
    best_loss, best_state = math.inf, None
    with progress_bar(steps and steps * epochs, "fit", progress) as bar:
        for epoch in range(epochs):
            bar.set_description(f"epoch {epoch + 1}/{epochs}")
            history.train_loss.append(
                _epoch(
                    model,
                    _fresh(train_batches),
                    loss_fn,
                    optimizer,
                    bar,
                    history,
                    accumulate,
                    **options,
                )
            )
            if val_batches is None:
                continue
            history.val_loss.append(evaluate(model, val_batches, loss_fn))
            if history.val_loss[-1] < best_loss:
                best_loss, history.best_epoch = history.val_loss[-1], epoch
                if patience is not None:
                    best_state = {
                        k: v.detach().clone()
                        for k, v in model.state_dict().items()
                    }
            elif patience and epoch - history.best_epoch >= patience:
                history.stopped_early = True
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return history
