"""Relative position biases on the attention scores (chapter 9).

Each scheme adds a term :math:`b_{ij}` to the score of query i and key j,

.. math::

    \\mathrm{softmax}\\!\\left(\\frac{q_i K^\\top}{\\sqrt{d_k}} + b_{i\\cdot}
    \\right),

that depends on the offset :math:`j - i`, never on i or j alone:

* ALiBi (Press et al., 2022): :math:`b_{ij} = -m_h\\,|i - j|`, a fixed
  slope :math:`m_h` per head, nothing learned;
* T5 (Raffel et al., 2020): one learned scalar per head and *bucket* of
  offsets, exact near 0 and logarithmic up to ``max_distance``;
* Shaw et al. (2018): a learned vector :math:`a_{j-i}` per offset,
  clipped at ``max_distance``, added to the key:
  :math:`q_i (k_j + a_{j-i})^\\top / \\sqrt{d_k}`, whose extra term
  :math:`q_i a_{j-i}^\\top / \\sqrt{d_k}` is the bias.

Positions are those of :class:`~transformer_lite.positional.RelativePosition`:
for self-attention only (cross-attention has no relative position).
"""

import math

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_bool, check_int
from transformer_lite.positional import RelativePosition
from transformer_lite.scores import full_precision, scaled_query, score_dtype

__all__ = [
    "ALiBiBias",
    "ShawRelativeKeys",
    "T5RelativeBias",
    "alibi_slopes",
    "relative_offsets",
    "t5_bucket",
]


def relative_offsets(query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """j - i for every query position i and key position j.

    Shape:
        query_positions: (Lq,); key_positions: (Lk,); output: (Lq, Lk).
    """
    return key_positions.unsqueeze(0) - query_positions.unsqueeze(1)


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's slope per head: for H a power of two, the geometric
    sequence :math:`2^{-8/H}, 2^{-16/H}, \\dots, 2^{-8}`; otherwise the
    slopes of the largest power of two P < H, then every other slope of
    2P (the paper's rule), H in all."""
    check_int("n_heads", n_heads, low=1)

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8 * (h + 1) / n) for h in range(n)]

    P = 2 ** (n_heads.bit_length() - 1)  # the largest power of two <= H
    return geometric(P) + geometric(2 * P)[0::2][: n_heads - P]


class ALiBiBias(RelativePosition):
    """Attention with linear biases: :math:`b_{ij} = -m_h |i - j|`.

    Press et al. define it for causal attention, where :math:`j \\le i`.
    In an encoder we use the symmetric :math:`|i - j|` that the authors
    suggest: a key is penalised by its distance on either side, so ALiBi
    alone cannot tell left from right (chapter 9 shows it).

    Args:
        n_heads: number of heads H (one slope each, none learned).

    Shape:
        output of :meth:`bias`: (H, Lq, Lk).
    """

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        slopes = torch.tensor(alibi_slopes(n_heads))  # (H,)
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(
        self, query: Tensor, query_positions: Tensor, key_positions: Tensor
    ) -> Tensor:
        offset = relative_offsets(query_positions, key_positions)
        distance = offset.abs().to(score_dtype(query.dtype))  # (Lq, Lk)
        m = self.slopes.to(distance.dtype).view(-1, 1, 1)  # (H, 1, 1)
        return -m * distance  # (H, Lq, Lk)


def t5_bucket(
    offset: Tensor,
    *,
    bidirectional: bool,
    n_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of each offset j - i (key position minus query's).

    Bidirectional: half the buckets for keys after the query, half for
    the rest. Causal: keys after the query share bucket 0 with the
    query itself (the mask hides them). Within a half of n buckets,
    distances below n / 2 get a bucket each; from there the buckets
    widen logarithmically, on a scale that would end at
    ``max_distance``. The bucket index is rounded down, so the last
    bucket starts before ``max_distance`` and holds every longer
    distance: for 32 buckets and ``max_distance`` 128, from distance 91
    (bidirectional) or 113 (causal).

    Shape:
        offset: any, integers; output: as offset, in [0, n_buckets).

    Raises:
        ValueError: too few buckets, or a ``max_distance`` no longer than
            the exact half of the buckets (the logarithm would divide by
            zero or less).
    """
    check_bool("bidirectional", bidirectional)
    check_int("n_buckets", n_buckets, low=4 if bidirectional else 2)
    check_int("max_distance", max_distance, low=1)
    if not isinstance(offset, Tensor) or offset.dtype.is_floating_point:
        raise ValueError("offset must be a tensor of integer offsets")
    half = n_buckets // 2 if bidirectional else n_buckets
    if max_distance <= half // 2:
        raise ValueError(
            f"max_distance must exceed the {half // 2} exact buckets "
            f"(n_buckets={n_buckets}, bidirectional={bidirectional}), "
            f"got {max_distance}"
        )
    if bidirectional:
        n_buckets //= 2
        after = (offset > 0).long() * n_buckets  # keys after the query
        distance = offset.abs()
    else:
        after = torch.zeros_like(offset)
        distance = (-offset).clamp(min=0)  # keys before the query
    exact = n_buckets // 2
    # log(distance / exact) / log(max_distance / exact) runs from 0 at
    # distance = exact to 1 at max_distance; it spreads the other
    # n_buckets - exact buckets. clamp: no log(0) where it is unused.
    ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(
        max_distance / exact
    )
    wide = exact + (ratio * (n_buckets - exact)).long()
    wide = wide.clamp(max=n_buckets - 1)
    return after + torch.where(distance < exact, distance, wide)


class T5RelativeBias(RelativePosition):
    """T5's bias: one learned scalar per head and bucket of offsets.

    T5 shares one such table among all the layers of a stack; the
    encoder's is bidirectional, the decoder's causal. It starts at zero,
    so the model starts without a preference for any offset.

    Args:
        n_heads: number of heads H.
        bidirectional: True in an encoder, False in a causal decoder.
        n_buckets: buckets (32 in T5).
        max_distance: where the logarithmic scale of the buckets
            ends (128 in T5); the last bucket starts before it
            (:func:`t5_bucket`).

    Shape:
        output of :meth:`bias`: (H, Lq, Lk).
    """

    def __init__(
        self,
        n_heads: int,
        *,
        bidirectional: bool,
        n_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__()
        check_int("n_heads", n_heads, low=1)
        self.bidirectional = check_bool("bidirectional", bidirectional)
        self.n_buckets = check_int("n_buckets", n_buckets, low=2)
        self.max_distance = check_int("max_distance", max_distance, low=1)
        half = n_buckets // 2 if bidirectional else n_buckets
        if not 0 < half // 2 < max_distance:
            raise ValueError(
                f"T5's exact buckets ({half // 2}) must be more than 0 "
                f"and fewer than max_distance ({max_distance}); got "
                f"n_buckets={n_buckets}"
            )
        self.table = nn.Embedding(n_buckets, n_heads)  # (buckets, H)
        nn.init.zeros_(self.table.weight)

    def bias(
        self, query: Tensor, query_positions: Tensor, key_positions: Tensor
    ) -> Tensor:
        offset = relative_offsets(query_positions, key_positions)
        bucket = t5_bucket(
            offset,
            bidirectional=self.bidirectional,
            n_buckets=self.n_buckets,
            max_distance=self.max_distance,
        )  # (Lq, Lk)
        return self.table(bucket).permute(2, 0, 1)  # (H, Lq, Lk)


class ShawRelativeKeys(RelativePosition):
    """Shaw et al.'s relative keys: score :math:`q_i (k_j + a_{j-i})^\\top
    / \\sqrt{d_k}`, with one learned vector :math:`a_r` per offset r,
    clipped to [-max_distance, max_distance] and shared by the heads.

    The paper also gives the values a second table; we keep the keys'
    one. Each layer has its own table. The bias is computed without an
    (Lq, Lk, D) tensor: the query meets each of the 2k + 1 vectors once,
    and each (i, j) picks the product of its offset.

    Args:
        d_k: head size D.
        max_distance: the clipping distance k (16 in the paper).

    Shape:
        output of :meth:`bias`: (B, H, Lq, Lk).
    """

    def __init__(self, d_k: int, max_distance: int = 16) -> None:
        super().__init__()
        self.d_k = check_int("d_k", d_k, low=1)
        self.max_distance = check_int("max_distance", max_distance, low=0)
        self.table = nn.Embedding(2 * max_distance + 1, d_k)  # a_{-k..k}
        nn.init.normal_(self.table.weight, std=1 / math.sqrt(d_k))

    def clipped(
        self, query_positions: Tensor, key_positions: Tensor
    ) -> Tensor:
        """Row of the table for each (i, j): clip(j - i, -k, k) + k.

        Shape:
            output: (Lq, Lk), integers in [0, 2k].
        """
        k = self.max_distance
        offset = relative_offsets(query_positions, key_positions)
        return offset.clamp(-k, k) + k  # (Lq, Lk)

    def bias(
        self, query: Tensor, query_positions: Tensor, key_positions: Tensor
    ) -> Tensor:
        row = self.clipped(query_positions, key_positions)  # (Lq, Lk)
        with full_precision(query.device):
            q = scaled_query(query)  # Q / sqrt(d_k)
            a = self.table.weight.to(q.dtype)  # (2k + 1, D)
            per_offset = q @ a.transpose(0, 1)  # (B, H, Lq, 2k + 1)
        row = row.expand(*per_offset.shape[:-1], row.size(-1))
        return per_offset.gather(-1, row)  # (B, H, Lq, Lk)
