"""Positional encodings (chapter 4), and where relative ones enter
attention (chapter 9).

.. math::

    PE_{(pos, 2i)} = \\sin\\!\\left(pos / 10000^{2i / d_{model}}\\right),
    \\qquad
    PE_{(pos, 2i+1)} = \\cos\\!\\left(pos / 10000^{2i / d_{model}}\\right)

Absolute schemes add a vector per position to the embeddings: the
sinusoidal table, a learned table, or nothing
(:class:`NoPositionalEncoding`). Relative schemes act inside attention
instead, through the two hooks of :class:`RelativePosition`.
"""

import math

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_int, check_real

__all__ = [
    "LearnedPositionalEmbedding",
    "NoPositionalEncoding",
    "RelativePosition",
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
        x: (B, L, C) with offset + L <= max_len; output: (B, L, C).
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

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add the vectors of positions offset .. offset + L - 1."""
        _check_length(x, self.d_model, self.max_len, offset)
        L = x.size(1)
        positions = torch.arange(offset, offset + L, device=x.device)  # (L,)
        return self.dropout(x + self.embedding(positions))


class NoPositionalEncoding(nn.Module):
    """No absolute positions: dropout on the embeddings only, for models
    whose positions enter attention (chapter 9) or that have none.

    Shape:
        x: (B, L, C) with offset + L <= max_len; output: (B, L, C).
    """

    def __init__(
        self, d_model: int, dropout: float = 0.1, max_len: int = 5000
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_length(x, self.d_model, self.max_len, offset)
        return self.dropout(x)


class RelativePosition(nn.Module):
    """Where a relative scheme enters attention (chapter 9): the seam.

    Attention calls two hooks, and a scheme overrides one of them:

    * :meth:`rotate` turns each query and key by its position before the
      product (RoPE, :mod:`transformer_lite.rotary`);
    * :meth:`bias` returns a term added to the scores
      :math:`QK^\\top / \\sqrt{d_k}` before the mask and the softmax
      (ALiBi, T5, Shaw: :mod:`transformer_lite.relative`).

    Both take positions, not lengths, so that a cached decoding step
    (whose queries sit at positions t .. t + Lq - 1 and whose keys are
    0 .. t + Lq - 1) computes what the whole sequence would. As a bias
    is a tensor, every attention path takes it: the plain one adds it,
    the fused one passes it to ``F.scaled_dot_product_attention`` as a
    float mask, the chunked one adds it chunk by chunk. The base class
    does nothing, so a scheme overrides only its own hook.
    """

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys with row l turned by ``positions[l]``; the
        base class returns ``x`` unchanged.

        Shape:
            x: (B, H, L, D); positions: (L,), integers; output: as x.
        """
        return x

    def bias(
        self, query: Tensor, query_positions: Tensor, key_positions: Tensor
    ) -> Tensor | None:
        """The term added to the scaled scores, or None (the base class).

        ``query`` is the (rotated) query before scaling; only schemes
        whose bias depends on it (Shaw's) read it.

        Shape:
            query: (B, H, Lq, D); query_positions: (Lq,);
            key_positions: (Lk,); output: broadcasts to (B, H, Lq, Lk).
        """
        return None
