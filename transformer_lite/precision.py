"""Mixed-precision training (chapter 8).

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
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

if TYPE_CHECKING:  # a type only: training.py may import this module
    from transformer_lite.training import Batch, LossFn

__all__ = ["AMP_DTYPES", "autocast", "check_amp", "grad_scaler", "train_step"]

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
) -> torch.amp.GradScaler | None:
    """A ``GradScaler`` for float16 on CUDA; None otherwise (float32 and
    bfloat16 need no loss scaling)."""
    check_amp(device, amp_dtype)
    if amp_dtype != torch.float16:
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def train_step(
    model: nn.Module,
    batch: "Batch",
    loss_fn: "LossFn",
    optimizer: Optimizer,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    clip_norm: float | None = 1.0,
) -> float:
    """One optimizer step on one batch, forward pass and loss under
    :func:`autocast` in ``amp_dtype`` (None: plain float32).

    With a ``scaler`` (from :func:`grad_scaler`; needed for float16) the
    loss is scaled before ``backward``, the gradients are unscaled before
    clipping to ``clip_norm``, and the scaler steps the optimizer (or skips
    the step if a gradient overflowed). The model is put in training mode.

    Returns:
        the batch's loss as a float.

    Shape:
        the batch as :class:`~transformer_lite.training.Batch`: src (B, S),
        tgt_in and tgt_out (B, T); the model's logits (B, T, V).
    """
    device = next(model.parameters()).device
    if amp_dtype == torch.float16 and scaler is None:
        raise ValueError("float16 needs a scaler: pass grad_scaler(...)")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be positive or None: {clip_norm}")
    batch = batch.to(device)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, amp_dtype):
        logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
        loss: Tensor = loss_fn(logits, batch.tgt_out)  # (B, T, V) -> ()
    value = loss.item()
    if not math.isfinite(value):
        raise FloatingPointError(
            f"training loss is {value}; lower the learning rate"
        )
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # true gradients, for clipping
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # skipped if a gradient is inf or NaN
        scaler.update()
    return value
