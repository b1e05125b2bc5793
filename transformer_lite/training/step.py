"""One training step, for every case (chapters 6, 7 and 8).

:func:`train_step` is the only place in the package where an optimizer
steps. Its loss is the **sum** of the token losses of one or several
batches divided by N, the number of non-pad target tokens in all of
them. That one formula covers three cases that look different:

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
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from transformer_lite.device import module_device
from transformer_lite.tokens import check_token_ids
from transformer_lite.training.batch import Batch
from transformer_lite.training.distributed import shard, world

__all__ = [
    "AMP_DTYPES",
    "LossFn",
    "autocast",
    "check_amp",
    "grad_scaler",
    "train_step",
]

LossFn = Callable[[Tensor, Tensor], Tensor]  # (logits, targets) -> ()

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
    if amp_dtype not in AMP_DTYPES:
        raise ValueError(
            f"amp_dtype must be None, torch.bfloat16 or torch.float16, got "
            f"{amp_dtype!r}"
        )
    if amp_dtype == torch.float16 and device.type != "cuda":
        raise ValueError(
            f"float16 mixed precision needs loss scaling, which "
            f"transformer-lite does on CUDA only; on {device.type} use "
            "amp_dtype=torch.bfloat16 (float32's range, no scaling needed)"
        )
    if not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"torch.autocast does not support {device.type}")


def autocast(
    device: torch.device | str, amp_dtype: torch.dtype | None
) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` in ``amp_dtype``; a context that
    does nothing when ``amp_dtype`` is None. Wrap the forward pass and
    the loss, not the backward pass."""
    check_amp(device, amp_dtype)
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=amp_dtype)


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


def check_sum_loss(loss_fn: LossFn) -> None:
    """Refuse a loss function that says it averages: the step divides by
    the token count itself (a mean would be divided twice)."""
    reduction = getattr(loss_fn, "reduction", "sum")
    if reduction != "sum":
        raise ValueError(
            "loss_fn must return the sum of the token losses "
            f"(reduction='sum'), got reduction={reduction!r}; the training "
            "step divides by the number of target tokens itself"
        )


def _check_ids(model: nn.Module, batch: Batch) -> None:
    """The batch's ids inside the model's vocabularies, checked while the
    batch is still on the CPU, where reading values costs no sync."""
    config = getattr(getattr(model, "module", model), "config", None)
    if config is None or batch.src.device.type != "cpu":
        return
    check_token_ids(batch.src, config.src_vocab, "batch.src")
    check_token_ids(batch.tgt, config.tgt_vocab, "batch.tgt")


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


def _check_step(batches: list, clip_norm: float | None) -> None:
    if not batches or not all(isinstance(b, Batch) for b in batches):
        raise ValueError(
            "batches must be a Batch or a non-empty sequence of Batch, got "
            f"{[type(b).__name__ for b in batches]}"
        )
    check_clip_norm(clip_norm)


def train_step(
    model: nn.Module,
    batches: Batch | Sequence[Batch],
    loss_fn: LossFn,
    optimizer: Optimizer,
    *,
    scheduler: LRScheduler | None = None,
    clip_norm: float | None = 1.0,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """One optimizer step on one batch or, accumulating gradients, on
    several (the module docstring says why one formula serves all).

    For each batch: the forward pass and the loss under :func:`autocast`,
    then ``backward`` of loss_sum * W / N (W processes, N target tokens in
    all the batches); with DDP the gradients are exchanged only after the
    last batch. Then a check that the loss is finite, the gradient norm
    clipped to ``clip_norm``, the optimizer and ``scheduler`` stepped.

    Args:
        model: a :class:`~transformer_lite.model.Transformer`, or one
            wrapped in ``DistributedDataParallel`` when a process group
            exists; put in training mode.
        batches: :class:`~transformer_lite.training.batch.Batch` objects,
            each moved to the model's device. Under DDP, the whole
            (global) batches: each process takes its own share.
        loss_fn: (logits, targets) -> the **sum** over non-pad tokens,
            e.g. ``LabelSmoothingLoss(..., reduction="sum")``.
        scheduler: stepped once after the optimizer, if given.
        clip_norm: the largest gradient norm; None: no clipping.
        amp_dtype: None (float32), ``torch.bfloat16``, or
            ``torch.float16`` (CUDA; needs a ``scaler``).
        scaler: from :func:`grad_scaler`, kept across steps; None makes a
            disabled one (no scaling), which float16 refuses.

    Returns:
        the mean loss per non-pad target token (over all processes).

    Raises:
        FloatingPointError: if the loss is not finite; the optimizer has
            not stepped and the gradients are cleared.
    """
    batches = [batches] if isinstance(batches, Batch) else list(batches)
    _check_step(batches, clip_norm)
    check_sum_loss(loss_fn)
    device = module_device(model)
    if scaler is None:
        scaler = grad_scaler(device, amp_dtype)
    check_amp(device, amp_dtype)
    if amp_dtype == torch.float16 and not scaler.is_enabled():
        raise ValueError("float16 needs a scaler: pass grad_scaler(...)")
    rank, W = world()
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    if W > 1 and not ddp:
        raise ValueError(
            f"a process group of {W} is running: wrap the model in "
            "DistributedDataParallel so that gradients are averaged"
        )
    for batch in batches:
        _check_ids(model, batch)
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
            with autocast(device, amp_dtype):
                logits = model(
                    batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask
                )  # (B, T, V)
                loss_sum = loss_fn(logits, batch.tgt_out)  # ()
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
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scaler.step(optimizer)  # with float16: skipped if a gradient overflowed
    scaler.update()
    if scheduler is not None:
        scheduler.step()
    return loss
