"""What every attention kernel shares: its checks and the precision of
its scores (chapters 1, 8 and 9).

The plain, chunked and relative code all compute Q K^T / sqrt(d_k) the
same way: Q divided by sqrt(d_k) first, in float32 for 16-bit inputs
(as PyTorch's fused kernels accumulate), with autocast off, so that no
input the fused kernel handles overflows here.
"""

import contextlib
import math

import torch
from torch import Tensor

__all__ = ["check_qkv", "full_precision", "scaled_query", "score_dtype"]


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """A context in which autocast is off on ``device``, so that a
    product asked for in float32 really runs in float32."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention scores are computed in: float32 for 16-bit
    inputs (as PyTorch's fused kernels accumulate), else the input's."""
    return torch.promote_types(dtype, torch.float32)


def scaled_query(query: Tensor) -> Tensor:
    """Q / sqrt(d_k) in the score dtype: scaled before the product, since
    Q K^T alone can pass float16's largest value, 65504, where
    Q K^T / sqrt(d_k) does not, and bfloat16's 8 bits would blur scores
    that softmax amplifies."""
    return query.to(score_dtype(query.dtype)) / math.sqrt(query.size(-1))


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Raise a clear ``ValueError`` unless query, key and value are
    floating tensors of shapes (..., Lq, D), (..., Lk, D), (..., Lk, Dv)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            what = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a floating tensor, got {what}")
    if query.dim() < 2 or not query.dim() == key.dim() == value.dim():
        raise ValueError(
            "query, key and value must have the same number of dimensions "
            f"(at least 2), got shapes {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must share their last dimension d_k, got "
            f"query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length Lk, got "
            f"key {tuple(key.shape)} and value {tuple(value.shape)}"
        )
