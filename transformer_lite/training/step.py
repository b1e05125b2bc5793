"""One training step, for every model and every case (chapters 6, 7, 8,
10 and 11).

:func:`train_step` is the only place in the package where an optimizer
steps. What it minimises comes from an objective
(:mod:`~transformer_lite.training.objectives`): the **sum** of the token
losses of one or several batches, which the step divides by N, the
number of target tokens in all of them (each batch's ``n_tokens``).
That one formula covers three cases that look different:

* one batch: the mean loss per token, as usual;
* gradient accumulation, several batches before one step: the same
  gradient as one batch holding them all (each batch weighs by its
  tokens, not 1 / accumulate);
* data parallel (``DistributedDataParallel``): every process takes its
  share of the rows (:func:`~transformer_lite.training.distributed.shard`)
  but divides by the N of the whole batch, known to all of them; DDP
  averages the gradients over the W processes where a sum is wanted, so
  each multiplies by W. The step equals one process's step on the whole
  batch.

Mixed precision is an option of the same step.

Under ``torch.autocast`` the matrix products run in a 16-bit float while
the parameters, their gradients and the optimizer's state stay float32.
The two 16-bit formats trade range for precision differently:

* **bfloat16** keeps float32's 8 exponent bits (largest value about
  3.4e38) and has 8 bits of precision: nothing overflows that would not
  overflow in float32, so training needs no further care. CPUs and recent
  GPUs run it.
* **float16** has 5 exponent bits (largest 65504, smallest normal about
  6.1e-5) and 11 bits of precision: small gradients underflow to zero.
  Loss scaling (Micikevicius et al., 2018) multiplies the loss by a large
  factor before the backward pass and divides the gradients by it before
  the optimizer step; ``torch.amp.GradScaler`` adapts the factor and
  skips a step whose gradients overflowed. Used here on CUDA only.

Masks need no change: the package fills masked scores with
``torch.finfo(dtype).min`` of the dtype the scores have (chapter 2), a
finite number in every dtype, and zeroes the weights of a query row that
may attend to nothing.
"""

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.checks import check_bool, check_int
from transformer_lite.device import module_device
from transformer_lite.training.distributed import shard, world
from transformer_lite.training.objectives import Objective

__all__ = [
    "AMP_DTYPES",
    "TrainOptions",
    "autocast",
    "check_amp",
    "grad_scaler",
    "train_step",
]

AMP_DTYPES = (torch.bfloat16, torch.float16)  # what autocast may compute in


def check_amp(
    device: torch.device | str, amp_dtype: torch.dtype | None
) -> None:
    """Raise a clear ``ValueError`` unless ``amp_dtype`` is None (plain
    float32) or a 16-bit float that autocast runs on ``device``.

    float16 is accepted on CUDA only, where it trains with a
    ``GradScaler``; elsewhere use bfloat16, which needs no scaling.
    """
    if amp_dtype is None:
        return
    device = torch.device(device)
    _check_amp_dtype(amp_dtype)
    if amp_dtype == torch.float16 and device.type != "cuda":
        raise ValueError(
            f"float16 mixed precision needs loss scaling, which "
            f"transformer-lite does on CUDA only; on {device.type} use "
            "amp_dtype=torch.bfloat16 (float32's range, no scaling needed)"
        )
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"torch.autocast does not support {device.type}")


def _check_amp_dtype(amp_dtype: torch.dtype | None) -> None:
    if amp_dtype is not None and amp_dtype not in AMP_DTYPES:
        raise ValueError(
            f"amp_dtype must be None, torch.bfloat16 or torch.float16, got "
            f"{amp_dtype!r}"
        )


def autocast(
    device: torch.device | str, amp_dtype: torch.dtype | None
) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` in ``amp_dtype``; a context that
    does nothing when ``amp_dtype`` is None. Wrap the forward pass and
    the loss, not the backward pass."""
    check_amp(device, amp_dtype)
    return _autocast(torch.device(device), amp_dtype)


def _autocast(device: torch.device, amp_dtype: torch.dtype | None):
    """:func:`autocast` for options already checked."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype)


def grad_scaler(
    device: torch.device | str, amp_dtype: torch.dtype | None
) -> torch.amp.GradScaler:
    """A ``GradScaler`` that scales the loss for float16 (CUDA only) and
    does nothing otherwise (float32 and bfloat16 need no loss scaling):
    then ``scale`` returns the loss unchanged and ``step`` simply steps
    the optimizer. Keep one for the whole run: it learns its scale."""
    check_amp(device, amp_dtype)
    enabled = amp_dtype == torch.float16
    return torch.amp.GradScaler(torch.device(device).type, enabled=enabled)


def check_clip_norm(clip_norm: float | None) -> None:
    """None, or a positive finite number (not a bool)."""
    if clip_norm is not None and (
        isinstance(clip_norm, bool)
        or not isinstance(clip_norm, int | float)
        or not 0 < clip_norm < math.inf
    ):
        raise ValueError(
            f"clip_norm must be a positive number or None, got {clip_norm!r}"
        )


@dataclass(frozen=True)
class TrainOptions:
    """How the step and the loop train, checked once, when built.

    Attributes:
        clip_norm: the largest gradient norm; None: no clipping.
        accumulate: batches per optimizer step (the loop groups them;
            :func:`train_step` takes its group explicitly).
        amp_dtype: None (float32), ``torch.bfloat16``, or
            ``torch.float16`` (CUDA only, with loss scaling).
        progress: show a progress bar where someone watches (the loop).
    """

    clip_norm: float | None = 1.0
    accumulate: int = 1
    amp_dtype: torch.dtype | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        check_clip_norm(self.clip_norm)
        check_int("accumulate", self.accumulate, low=1)
        _check_amp_dtype(self.amp_dtype)
        check_bool("progress", self.progress)


def _check_batches(batches: list) -> None:
    if not batches or not all(
        isinstance(getattr(b, "n_tokens", None), int) and hasattr(b, "to")
        for b in batches
    ):
        raise ValueError(
            "batches must be a batch (a Batch or Examples: n_tokens and "
            "to(device)) or a non-empty sequence of them, got "
            f"{[type(b).__name__ for b in batches]}"
        )


def check_step(
    model: nn.Module,
    objective: Objective,
    optimizer: Optimizer,
    options: TrainOptions,
    scaler: torch.amp.GradScaler | None,
) -> torch.amp.GradScaler:
    """Everything the step needs, checked once at the door (by
    :func:`train_step`, or once per run by the loop); returns the scaler
    to use, a disabled one when none is given."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model)}")
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be an Optimizer: {optimizer!r}")
    if not callable(objective):
        raise ValueError(
            "objective must be a function (model, batch) -> the summed "
            f"loss, e.g. seq2seq_loss(loss_fn); got {objective!r}"
        )
    if not isinstance(options, TrainOptions):
        raise ValueError(f"options must be TrainOptions, got {options!r}")
    device = module_device(model)
    check_amp(device, options.amp_dtype)
    if scaler is None:
        scaler = grad_scaler(device, options.amp_dtype)
    if options.amp_dtype == torch.float16 and not scaler.is_enabled():
        raise ValueError("float16 needs a scaler: pass grad_scaler(...)")
    W = world()[1]
    if W > 1 and not isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError(
            f"a process group of {W} is running: wrap the model in "
            "DistributedDataParallel so that gradients are averaged"
        )
    return scaler


def train_step(
    model: nn.Module,
    batches,
    objective: Objective,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    options: TrainOptions | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """One optimizer step on one batch or, accumulating gradients, on
    several (the module docstring says why one formula serves all).

    For each batch: the forward pass and the objective under
    :func:`autocast`, then ``backward`` of loss_sum * W / N (W
    processes, N target tokens in all the batches); with DDP the
    gradients are exchanged only after the last batch. Then a check that
    the loss is finite, the gradient norm clipped to
    ``options.clip_norm``, the optimizer and ``scheduler`` stepped.

    Args:
        model: put in training mode; under a process group, wrapped in
            ``DistributedDataParallel``.
        batches: a :class:`~transformer_lite.training.batch.Batch` or
            :class:`~transformer_lite.training.batch.Examples` (anything
            with ``n_tokens`` and ``to(device)``), or a list of them; each
            is moved to the model's device. Under DDP, the whole (global)
            batches: each process takes its own share.
        objective: (model, batch) -> the **sum** of the token losses,
            e.g. ``seq2seq_loss(LabelSmoothingLoss(..., reduction="sum"))``
            (:mod:`~transformer_lite.training.objectives`).
        scheduler: stepped once after the optimizer, if given.
        options: :class:`TrainOptions` (its ``clip_norm`` and
            ``amp_dtype``); None: the defaults.
        scaler: from :func:`grad_scaler`, kept across steps; None makes a
            disabled one (no scaling), which float16 refuses.

    Returns:
        the mean loss per target token (over all processes).

    Raises:
        FloatingPointError: if the loss is not finite; the optimizer has
            not stepped and the gradients are cleared.
    """
    if not isinstance(batches, Sequence):
        batches = [batches]
    batches = list(batches)
    _check_batches(batches)
    options = TrainOptions() if options is None else options
    scaler = check_step(model, objective, optimizer, options, scaler)
    return take_step(model, batches, objective, optimizer, scheduler,
                     options, scaler)  # fmt: skip


def take_step(
    model: nn.Module,
    batches: list,
    objective: Objective,
    optimizer: Optimizer,
    scheduler: LRScheduler | None,
    options: TrainOptions,
    scaler: torch.amp.GradScaler,
) -> float:
    """:func:`train_step` for arguments already checked by
    :func:`check_step` (the loop checks once per run, not once a step)."""
    device = module_device(model)
    rank, W = world()
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    N = sum(batch.n_tokens for batch in batches)  # the same on every rank
    if N == 0:
        raise ValueError("the batches hold no target tokens to learn from")
    if W > 1:
        batches = [shard(batch, rank, W) for batch in batches]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums = []  # each batch's loss sum, kept on the device
    for i, batch in enumerate(batches):
        batch = batch.to(device)
        last = i == len(batches) - 1
        # DDP exchanges gradients once, in the last batch's backward.
        sync = contextlib.nullcontext() if last or not ddp else model.no_sync()
        with sync:
            with _autocast(device, options.amp_dtype):
                loss_sum = objective(model, batch)  # ()
            scaler.scale(loss_sum * (W / N)).backward()
        sums.append(loss_sum.detach())
    total = torch.stack(sums).sum()
    if W > 1:
        dist.all_reduce(total)  # the sum over every process's share
    loss = total.item() / N  # a sync point: the CPU waits for the device
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"training loss is {loss}; lower the learning rate"
        )
    scaler.unscale_(optimizer)  # true gradients, for clipping
    if options.clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), options.clip_norm)
    scaler.step(optimizer)  # with float16: skipped if a gradient overflowed
    scaler.update()
    if scheduler is not None:
        scheduler.step()
    return loss
