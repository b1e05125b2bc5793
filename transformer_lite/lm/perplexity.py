"""The language model's loss and perplexity (chapter 10).

Trained to predict token t + 1 from tokens 0..t, a model is scored by
the mean negative log-likelihood of the held-out tokens, in nats, and
by its exponential, the perplexity:

.. math::

    \\mathrm{PPL} = \\exp\\Big(-\\frac{1}{N} \\sum_{t=1}^{N}
    \\log p(x_t \\mid x_{<t})\\Big),

the number of equally likely tokens the model is, on average, choosing
among (V for a uniform guess, 1 for certainty). Padding targets are
left out of both the sum and N.
"""

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.checks import check_int
from transformer_lite.device import eval_twin, module_device
from transformer_lite.tokens import PAD_ID, check_token_ids, check_token_tensor

__all__ = ["next_token_loss", "perplexity", "segments", "token_losses"]

MAX_LOG = math.log(1.7976931348623157e308)  # about 709.78: exp overflows


def next_token_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    pad_id: int = PAD_ID,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy of the next-token predictions, padding targets left
    out (the training loss): their mean, or with ``reduction="sum"``
    their sum, what the package's training step divides by the number of
    targets itself.

    Shape:
        logits: (B, L, V); targets: (B, L); output: ().
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"reduction must be 'mean' or 'sum', got {reduction!r}"
        )
    return F.cross_entropy(
        logits.flatten(0, 1),
        targets.flatten(),
        ignore_index=pad_id,
        reduction=reduction,
    )


def segments(
    stream: Tensor, segment_len: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Consecutive (inputs, targets) windows of ``stream``: segment j
    reads tokens jT .. jT + T - 1 and predicts jT + 1 .. jT + T, so that
    every token after the first is predicted exactly once. The last
    segment may be shorter.

    Shape:
        stream: (B, L); each yield: two (B, T) tensors (fewer columns
        at the end).
    """
    check_token_tensor(stream, "stream")
    check_int("segment_len", segment_len, low=1)
    if stream.size(1) < 2:
        raise ValueError(
            f"stream needs at least 2 tokens per row, got shape "
            f"{tuple(stream.shape)}"
        )
    for start in range(0, stream.size(1) - 1, segment_len):
        end = min(start + segment_len, stream.size(1) - 1)
        yield stream[:, start:end], stream[:, start + 1 : end + 1]


def token_losses(
    model: nn.Module,
    stream: Tensor,
    *,
    segment_len: int,
    mem_len: int = 0,
    pad_id: int = PAD_ID,
) -> tuple[Tensor, Tensor]:
    """The loss of every predicted token of ``stream``, read in
    consecutive segments, without dropout and without gradients. A model
    in training mode is read through an eval-mode twin sharing its
    weights (:func:`~transformer_lite.device.eval_twin`): its own mode
    is never changed, so a thread training it keeps its dropout.

    Args:
        model: a :class:`~transformer_lite.lm.model.LanguageModel`.
        stream: B streams of token ids, each read from its start.
        segment_len: T, the tokens the model reads at once; the context
            of a plain model starts again at every segment.
        mem_len: M > 0 carries a Transformer-XL memory of M positions
            from each segment to the next.
        pad_id: targets equal to it are not counted.

    Returns:
        ``(losses, counted)``: each token's negative log-likelihood in
        nats (0 where not counted) and a bool mask of those counted.

    Shape:
        stream: (B, L); losses, counted: (B, L - 1); position i is
        token i + 1 predicted at place i % T of its segment.
    """
    check_int("mem_len", mem_len, low=0)
    check_int("pad_id", pad_id, low=0)
    vocab = getattr(getattr(model, "config", None), "vocab", None)
    if isinstance(vocab, int):  # ids checked here, on the CPU side
        check_token_ids(stream, vocab, "stream")
    stream = stream.to(module_device(model))
    model = eval_twin(model)  # never model.eval(): model may be shared
    memory = model.new_memory(mem_len) if mem_len else None
    losses = []
    with torch.no_grad():
        for inputs, targets in segments(stream, segment_len):
            logits = model(inputs, memory=memory)  # (B, T, V)
            loss = F.cross_entropy(
                logits.transpose(1, 2),  # (B, V, T), as cross_entropy asks
                targets,
                ignore_index=pad_id,
                reduction="none",
            )  # (B, T)
            losses.append(loss)
    counted = stream[:, 1:] != pad_id  # (B, L - 1)
    return torch.cat(losses, dim=1), counted


def perplexity(
    model: nn.Module,
    stream: Tensor,
    *,
    segment_len: int,
    mem_len: int = 0,
    pad_id: int = PAD_ID,
) -> float:
    """exp of the mean loss of the counted tokens of ``stream``
    (:func:`token_losses`, same arguments)."""
    losses, counted = token_losses(
        model, stream, segment_len=segment_len, mem_len=mem_len, pad_id=pad_id
    )
    n = int(counted.sum())
    if n == 0:
        raise ValueError("stream holds no target token that is not padding")
    mean = float(losses.sum()) / n
    # A diverged model's mean loss can pass 709 nats, where exp
    # overflows a float: its perplexity is then infinite, not an error.
    return math.exp(mean) if mean < MAX_LOG else math.inf
