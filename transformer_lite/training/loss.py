"""Label smoothing (chapter 6): cross-entropy against a softened target."""

import math

import torch
from torch import Tensor, nn

from transformer_lite.tokens import check_ids_here

__all__ = ["LabelSmoothingLoss"]

SPREADS = ("all", "others")  # where label smoothing puts its mass
REDUCTIONS = ("mean", "sum")


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy -sum_k q_k log p_k against a smoothed target q.

    q keeps 1 - eps on the true token and spreads eps = ``smoothing``:
    ``spread="all"`` (Szegedy et al., 2016; torch): eps / V on every token,
    the true one and padding included, so the loss equals
    ``nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_id)``;
    ``spread="others"`` (the Annotated Transformer): eps / (V - 2) on every
    token except the true one and padding. ``kl=True`` subtracts the
    entropy of q (the KL divergence, 0 at best; same gradients).

    Positions whose target is ``pad_id`` count for nothing. ``"mean"``
    divides by the number of non-pad targets (as torch), giving 0.0, not
    NaN, when there are none; ``"sum"`` does not divide. Computed from
    ``log_softmax`` in float32 or wider: finite logits give a finite loss.

    Args:
        vocab_size: V, the number of classes.
        pad_id: the padding id, in [0, V); its targets are ignored.
        smoothing: eps, in [0, 1); 0 gives plain cross-entropy.
        spread: ``"all"`` or ``"others"``, as above.
        kl: subtract the entropy of q, as above.
        reduction: ``"mean"`` or ``"sum"``, as above.

    Shape:
        logits: (B, T, V) or (N, V); targets: (B, T) or (N,); output: ().
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        smoothing: float = 0.1,
        spread: str = "all",
        kl: bool = False,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        if spread not in SPREADS or reduction not in REDUCTIONS:
            raise ValueError(
                f"spread must be one of {SPREADS} and reduction one of "
                f"{REDUCTIONS}, got {spread!r} and {reduction!r}"
            )
        smallest = 3 if spread == "others" else 2
        if not isinstance(vocab_size, int) or vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be an int >= {smallest} for "
                f"spread={spread!r}, got {vocab_size!r}"
            )
        if not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ValueError(
                f"pad_id must be an int in [0, {vocab_size}), got {pad_id!r}"
            )
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.vocab_size, self.pad_id = vocab_size, pad_id
        self.smoothing, self.spread = smoothing, spread
        self.kl, self.reduction = kl, reduction
        n_spread = vocab_size if spread == "all" else vocab_size - 2
        self.share = smoothing / n_spread  # q_k of a token that is not true
        # q of the true token, and the entropy of q (the loss's floor).
        self.confidence = 1.0 - smoothing + (spread == "all") * self.share
        wrong = n_spread - (spread == "all")  # tokens that get only share
        self.entropy = -_xlogx(self.confidence) - wrong * _xlogx(self.share)

    def smoothed_targets(
        self, targets: Tensor, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """The distribution q, one row per target; zero rows for padding.

        Shape:
            targets: (...); output: (..., V).
        """
        shape = (*targets.shape, self.vocab_size)
        q = torch.full(shape, self.share, dtype=dtype, device=targets.device)
        if self.spread == "others":
            q[..., self.pad_id] = 0.0
        q.scatter_(-1, targets.unsqueeze(-1), self.confidence)
        return q.masked_fill((targets == self.pad_id).unsqueeze(-1), 0.0)

    def _check(self, logits: Tensor, targets: Tensor) -> None:
        if logits.dim() not in (2, 3) or logits.size(-1) != self.vocab_size:
            raise ValueError(
                f"logits must be (B, T, V) or (N, V) with V = vocab_size = "
                f"{self.vocab_size}, got shape {tuple(logits.shape)}"
            )
        if targets.shape != logits.shape[:-1]:
            raise ValueError(
                f"targets must have shape {tuple(logits.shape[:-1])} to "
                f"match logits {tuple(logits.shape)}, got "
                f"{tuple(targets.shape)}"
            )
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise ValueError(f"targets must be token ids, got {targets.dtype}")
        # the ids' range where reading them costs nothing (the CPU): a
        # target past V would otherwise fail deep in gather
        rows = targets if targets.dim() == 2 else targets[None]  # (., L)
        check_ids_here(rows, self.vocab_size, "targets")

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        self._check(logits, targets)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_p = logits.to(dtype).log_softmax(dim=-1)  # (..., V)
        # -sum_k q_k log p_k without building q: the true token's term and
        # the sum over the tokens that share eps.
        log_p_true = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if self.spread == "others":
            # Sum only the tokens that get a share, never subtract: a pad
            # log-probability of -inf (or -1e9) would give NaN (or lose
            # every digit of the others) in sum - log p_true - log p_pad.
            shared = torch.ones_like(log_p, dtype=torch.bool)  # (..., V)
            shared[..., self.pad_id] = False
            shared.scatter_(-1, targets.unsqueeze(-1), False)
            log_p = log_p.where(shared, 0.0)
        log_p_shared = log_p.sum(dim=-1)  # (...)
        loss = -(1 - self.smoothing) * log_p_true - self.share * log_p_shared
        if self.kl:
            loss = loss - self.entropy
        real = targets != self.pad_id
        total = loss.masked_fill(~real, 0.0).sum()
        if self.reduction == "sum":
            return total
        return total / real.sum().clamp(min=1)


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0
