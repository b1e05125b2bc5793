"""What a model is trained to do: the objective, the one thing a model
family adds to the training loop (chapters 6, 10 and 11).

An objective maps ``(model, batch)`` to the **sum** of the losses of the
batch's targets, a 0-dimensional tensor. The step divides by the
batch's ``n_tokens``, known before the forward pass: that is what lets
gradient accumulation backpropagate each piece at once, in the memory of
one piece, and still land where one big batch would (chapter 6).

* :func:`seq2seq_loss`: a translator, on a
  :class:`~transformer_lite.training.batch.Batch` (teacher forcing);
* :func:`supervised_loss`: any model called on its inputs, on
  :class:`~transformer_lite.training.batch.Examples`: a classifier of
  images, a language model, the image reader of chapter 11.

A model with state across batches (chapter 10's segment memory) writes
its own objective, a function of three lines.
"""

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from transformer_lite.training.batch import Batch, Examples

__all__ = ["LossFn", "Objective", "check_sum_loss", "seq2seq_loss",
           "supervised_loss"]  # fmt: skip

LossFn = Callable[[Tensor, Tensor], Tensor]  # (logits, targets) -> ()
Objective = Callable[[nn.Module, Any], Tensor]  # (model, batch) -> ()


def check_sum_loss(loss_fn: LossFn) -> None:
    """Refuse a loss function that says it averages: the step divides by
    the token count itself (a mean would be divided twice)."""
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {loss_fn!r}")
    reduction = getattr(loss_fn, "reduction", "sum")
    if reduction != "sum":
        raise ValueError(
            "loss_fn must return the sum of the token losses "
            f"(reduction='sum'), got reduction={reduction!r}; the training "
            "step divides by the number of target tokens itself"
        )


def seq2seq_loss(loss_fn: LossFn) -> Objective:
    """The translator's objective: teacher forcing on a :class:`Batch`,
    ``loss_fn(model(src, tgt_in, src_mask, tgt_mask), tgt_out)``.

    Args:
        loss_fn: (logits (B, T, V), targets (B, T)) -> the sum over
            non-pad targets, e.g. ``LabelSmoothingLoss(...,
            reduction="sum")``.
    """
    check_sum_loss(loss_fn)

    def objective(model: nn.Module, batch: Batch) -> Tensor:
        logits = model(
            batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask
        )  # (B, T, V)
        return loss_fn(logits, batch.tgt_out)

    return objective


def supervised_loss(loss_fn: LossFn) -> Objective:
    """The objective of a model called on :class:`Examples`:
    ``loss_fn(model(*inputs), targets)``, with the predictions flattened
    to (N, V) and the targets to (N,), so that one loss serves a label
    per image and a token per place.

    Args:
        loss_fn: (logits (N, V), targets (N,)) -> the sum, e.g.
            ``nn.CrossEntropyLoss(reduction="sum", ignore_index=PAD_ID)``
            (with the same ``ignore_index`` as the examples).
    """
    check_sum_loss(loss_fn)

    def objective(model: nn.Module, batch: Examples) -> Tensor:
        logits = model(*batch.inputs)  # (B, V) or (B, T, V)
        return loss_fn(logits.flatten(0, -2), batch.targets.flatten())

    return objective
