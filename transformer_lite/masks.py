"""Attention masks (chapter 2).

One convention everywhere in transformer-lite: a mask is a boolean tensor and
**True means "may attend"**, as in
``torch.nn.functional.scaled_dot_product_attention``. ``nn.MultiheadAttention``
and ``nn.Transformer`` use the opposite (True = masked out);
:func:`to_torch_attn_mask` is the one place that converts.
"""

import torch
from torch import Tensor

from transformer_lite.checks import check_int
from transformer_lite.tokens import check_token_tensor

__all__ = [
    "causal_mask",
    "check_mask",
    "local_mask",
    "padding_mask",
    "target_mask",
    "to_torch_attn_mask",
]


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """The "subsequent" mask: position i may attend to positions 0..i.

    Args:
        size: sequence length L.
        device: where to create the mask.

    Shape:
        output: (1, L, L), bool, True on and below the diagonal.
    """
    check_int("size", size, low=1)
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return torch.tril(ones).unsqueeze(0)  # (1, L, L)


def local_mask(
    size: int, window: int, device: torch.device | str | None = None
) -> Tensor:
    """Sliding-window causal mask: i may attend to i - window + 1 .. i.

    The simplest sparse attention pattern (chapter 8): each position sees
    only its ``window`` most recent positions, itself included.

    Shape:
        output: (1, L, L), bool.
    """
    check_int("window", window, low=1)
    mask = causal_mask(size, device)  # (1, L, L)
    return mask & ~torch.tril(mask, diagonal=-window)


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """True where a key is a real token, False where it is padding.

    Args:
        tokens: token ids.
        pad_id: the id used for padding.

    Shape:
        tokens: (B, S); output: (B, 1, S), which broadcasts over queries.
    """
    check_token_tensor(tokens, "tokens")
    check_int("pad_id", pad_id)
    return (tokens != pad_id).unsqueeze(1)  # (B, 1, S)


def target_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """The decoder's self-attention mask: not padding, and not the future.

    Shape:
        tgt: (B, T); output: (B, T, T).
    """
    check_token_tensor(tgt, "tgt")
    causal = causal_mask(tgt.size(1), device=tgt.device)  # (1, T, T)
    return padding_mask(tgt, pad_id) & causal  # (B, T, T)


def check_mask(mask: Tensor, scores_shape: torch.Size) -> None:
    """Raise a clear ``ValueError`` unless ``mask`` is a bool tensor that
    broadcasts to attention scores of shape ``scores_shape``."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask)}")
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor (True = may attend), got dtype "
            f"{mask.dtype}; convert with mask.bool() or (mask != 0)"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the "
            f"attention scores of shape {tuple(scores_shape)} "
            "(expected e.g. (B, Lq, Lk), (B, 1, Lk) or (B, H, Lq, Lk))"
        )


def to_torch_attn_mask(mask: Tensor) -> Tensor:
    """Convert our mask (True = may attend) to the convention of
    ``nn.MultiheadAttention`` and ``nn.Transformer`` (True = masked out).

    The conversion is its own inverse; it exists so that the flip happens in
    exactly one, tested, place.
    """
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    return ~mask
