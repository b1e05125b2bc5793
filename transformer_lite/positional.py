"""Positional encodings (chapter 4).

.. math::

    PE_{(pos, 2i)} = \\sin\\!\\left(pos / 10000^{2i / d_{model}}\\right),
    \\qquad
    PE_{(pos, 2i+1)} = \\cos\\!\\left(pos / 10000^{2i / d_{model}}\\right)
"""

import math

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_int, check_real

__all__ = [
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_table",
]


def sinusoidal_table(
    max_len: int,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The paper's table of sines and cosines, one row per position.

    Computed in float64 and then cast, so every dtype gets the best table.

    Args:
        max_len: number of positions.
        d_model: model width C (even).
        base: the wavelength scale, 10000 in the paper.

    Shape:
        output: (max_len, C).
    """
    check_int("max_len", max_len, low=1)
    if check_int("d_model", d_model, low=2) % 2:
        raise ValueError(f"d_model must be even, got {d_model!r}")
    check_real("base", base, low=1.0)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (C/2,)
    angle = pos / base ** (two_i / d_model)  # (L, C/2)
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.to(dtype)  # (L, C)


def _check_length(
    x: Tensor, d_model: int, max_len: int, offset: int = 0
) -> None:
    if x.dim() != 3 or x.size(-1) != d_model:
        raise ValueError(
            f"expected input of shape (B, L, d_model={d_model}), "
            f"got {tuple(x.shape)}"
        )
    check_int("offset", offset, low=0)
    if offset + x.size(1) > max_len:
        raise ValueError(
            f"sequence length {offset + x.size(1)} is longer than the "
            f"positional table (max_len={max_len}); build the model with "
            "a larger max_len"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Add the sinusoidal table to the embeddings, then apply dropout.

    The table is a non-persistent buffer: it moves with ``.to(device)`` but
    is not saved in checkpoints, since it is a fixed function of the shape.

    Args:
        d_model: model width C.
        dropout: dropout applied to the sum.
        max_len: the longest sequence the table covers.

    Shape:
        x: (B, L, C) with offset + L <= max_len; output: (B, L, C).
    """

    def __init__(
        self, d_model: int, dropout: float = 0.1, max_len: int = 5000
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        table = sinusoidal_table(max_len, d_model)
        self.register_buffer("table", table, persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add positions offset .. offset + L - 1 (offset > 0 when decoding
        one token at a time)."""
        _check_length(x, self.d_model, self.max_len, offset)
        pe = self.table[offset : offset + x.size(1)].to(x.dtype)  # (L, C)
        return self.dropout(x + pe)


class LearnedPositionalEmbedding(nn.Module):
    """The alternative: one trained vector per position (as in BERT, GPT).

    Shape:
        x: (B, L, C) with L <= max_len; output: (B, L, C).
    """

    def __init__(
        self, d_model: int, dropout: float = 0.1, max_len: int = 512
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=1 / math.sqrt(d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        _check_length(x, self.d_model, self.max_len)
        positions = torch.arange(x.size(1), device=x.device)  # (L,)
        return self.dropout(x + self.embedding(positions))
