"""Memory-efficient attention: the online softmax (chapter 8).

Plain attention builds the whole (Lq, Lk) matrix of scores, so its memory
grows with the square of the length: at L = 8192 one float32 matrix per
head is 256 MiB. :func:`chunked_attention` never builds it. It visits the
keys a chunk at a time and keeps, for every query, a running maximum, a
running sum of exponentials and a running weighted sum of values: the
online softmax (Milakov and Gimelshein, 2018) that FlashAttention (Dao et
al., 2022) runs inside one GPU kernel. Here it is plain PyTorch, one
operation per line; ``transformer_lite.bench`` measures what it saves.
A relative position bias (chapter 9) is computed chunk by chunk too.
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from transformer_lite.checks import check_int
from transformer_lite.masks import check_mask
from transformer_lite.scores import check_qkv, full_precision, scaled_query

__all__ = ["chunked_attention"]

# bias(query_block, query_index, key_index) -> the block's bias, e.g. a
# RelativePosition's bias method; the indices count from 0 in Lq and Lk.
BiasFunction = Callable[[Tensor, Tensor, Tensor], Tensor]


def chunked_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    chunk_size: int = 256,
    query_chunk_size: int | None = None,
    recompute: bool = False,
    *,
    bias: Tensor | BiasFunction | None = None,
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k) + bias) V without the (Lq, Lk) matrix of
    scores.

    The keys and values are visited in chunks :math:`K_j, V_j`. Each query
    row carries a running maximum :math:`m` (start :math:`-\\infty`), a
    running sum :math:`\\ell` (``ell``, start 0) and a running output :math:`o`
    (start 0), updated chunk by chunk:

    .. math::

        s &= q K_j^\\top / \\sqrt{d_k} \\\\
        m' &= \\max(m, \\max_i s_i) \\\\
        p &= \\exp(s - m') \\\\
        \\alpha &= \\exp(m - m') \\\\
        \\ell' &= \\alpha\\, \\ell + \\textstyle\\sum_i p_i \\\\
        o' &= \\alpha\\, o + p\\, V_j

    and at the end the output is :math:`o / \\ell`. The factor
    :math:`\\alpha` rescales what was summed under the old maximum, so the
    result equals the softmax over all keys exactly (up to rounding).

    Masked scores are :math:`-\\infty`, so their :math:`p` is exactly 0. A
    query row with no allowed key keeps :math:`\\ell = 0` and gets a zero
    output, never NaN, as in
    :func:`~transformer_lite.attention.scaled_dot_product_attention`.
    Half-precision inputs are accumulated in float32.

    Args:
        query, key, value: as for ``scaled_dot_product_attention``.
        mask: bool, True = may attend; must broadcast to (..., Lq, Lk).
        chunk_size: keys per chunk; need not divide Lk.
        query_chunk_size: also split the queries into blocks of this many
            rows (None: all queries at once), so memory stays bounded
            whatever Lq is.
        recompute: when gradients are needed, store only each query
            block's output and recompute its weights in the backward pass
            (activation checkpointing), as FlashAttention's backward does.
            Without it, autograd keeps every chunk's ``p`` for the
            backward pass: O(Lq * Lk) memory again, as plain attention.
        bias: added to the scaled scores (chapter 9): a tensor that
            broadcasts to (..., Lq, Lk), or, to keep memory bounded, a
            function ``bias(query_block, query_index, key_index)`` that
            returns the bias of those queries and keys (indices count
            from 0; a ``RelativePosition``'s ``bias`` method is one).

    Shape:
        query: (..., Lq, D); key: (..., Lk, D); value: (..., Lk, Dv);
        output: (..., Lq, Dv). Working memory: O(Lq * chunk_size), or
        O(query_chunk_size * chunk_size) with query blocks.
    """
    check_qkv(query, key, value)
    for name, size in (
        ("chunk_size", chunk_size),
        ("query_chunk_size", query_chunk_size),
    ):
        if size is not None:
            check_int(name, size, low=1)
    Lq, Lk = query.size(-2), key.size(-2)
    if mask is not None:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        check_mask(mask, batch + (Lq, Lk))
        mask = torch.atleast_2d(mask)  # (..., Lq or 1, Lk or 1)
    block = query_chunk_size or Lq
    outputs = []
    for start in range(0, Lq, block):
        stop = min(start + block, Lq)
        q = query[..., start:stop, :]  # (..., Lb, D)
        block_mask = _narrow(mask, -2, start, stop)
        block_bias = _block_bias(bias, q, start, stop)
        if recompute and torch.is_grad_enabled():
            out = checkpoint(
                _attend_block,
                q,
                key,
                value,
                block_mask,
                chunk_size,
                block_bias,
                use_reentrant=False,
            )
        else:
            out = _attend_block(
                q, key, value, block_mask, chunk_size, block_bias
            )
        outputs.append(out)  # (..., Lb, Dv)
    return torch.cat(outputs, dim=-2)  # (..., Lq, Dv)


def _narrow(mask: Tensor | None, dim: int, start: int, stop: int):
    """``mask`` restricted to positions start..stop-1 along ``dim``, unless
    it is None or broadcasts along that axis (size 1)."""
    if mask is None or mask.size(dim) == 1:
        return mask
    return mask.narrow(dim, start, stop - start)


def _block_bias(bias, q: Tensor, start: int, stop: int):
    """The bias of queries start..stop-1, as a function of the key chunk
    (start and stop as indices into Lk), or None."""
    if bias is None:
        return None
    rows = torch.arange(start, stop, device=q.device)  # (Lb,)
    block = None
    if isinstance(bias, Tensor):
        block = _narrow(torch.atleast_2d(bias), -2, start, stop)

    def chunk_bias(begin: int, end: int) -> Tensor:
        if block is not None:
            return _narrow(block, -1, begin, end)  # (..., Lb or 1, c)
        keys = torch.arange(begin, end, device=q.device)  # (c,)
        return bias(q, rows, keys)  # (..., Lb, c)

    return chunk_bias


def _attend_block(
    q: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    chunk: int,
    bias: Callable[[int, int], Tensor] | None = None,
) -> Tensor:
    """The online softmax of one block of queries over every key chunk,
    accumulated in float32 (or float64) with autocast off."""
    with full_precision(q.device):
        return _online_softmax(q, key, value, mask, chunk, bias)


def _online_softmax(
    q: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    chunk: int,
    bias: Callable[[int, int], Tensor] | None,
) -> Tensor:
    Lq, Dv = q.size(-2), value.size(-1)
    batch = torch.broadcast_shapes(
        q.shape[:-2], key.shape[:-2], value.shape[:-2]
    )
    q = scaled_query(q)  # Q / sqrt(d_k), float32 or float64
    acc = q.dtype
    m = q.new_full(batch + (Lq, 1), -math.inf, dtype=acc)  # (..., Lq, 1)
    ell = q.new_zeros(batch + (Lq, 1), dtype=acc)  # (..., Lq, 1)
    o = q.new_zeros(batch + (Lq, Dv), dtype=acc)  # (..., Lq, Dv)
    for start in range(0, key.size(-2), chunk):
        stop = min(start + chunk, key.size(-2))
        k = key[..., start:stop, :]  # (..., c, D)
        v = value[..., start:stop, :]  # (..., c, Dv)
        s = q @ k.to(acc).transpose(-2, -1)  # (..., Lq, c)
        if bias is not None:
            s = s + bias(start, stop).to(acc)
        if mask is not None:
            s = s.masked_fill(~_narrow(mask, -1, start, stop), -math.inf)
        # The result does not depend on the shift m (it cancels in o / l),
        # so no gradient needs to flow through it.
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        # While a row has seen only masked keys, m_new = -inf; shifting by
        # 0 instead gives exp(-inf) = 0 rather than exp(-inf + inf) = NaN.
        shift = m_new.masked_fill(m_new == -math.inf, 0.0)  # (..., Lq, 1)
        p = torch.exp(s - shift)  # (..., Lq, c)
        alpha = torch.exp(m - shift)  # (..., Lq, 1)
        ell = alpha * ell + p.sum(dim=-1, keepdim=True)
        o = alpha * o + (p.to(v.dtype) @ v).to(acc)  # (..., Lq, Dv)
        m = m_new
    # ell >= 1 for any row with an allowed key (its maximum contributes
    # exp(0) = 1); ell = 0 means no allowed key, and then o = 0 too.
    ell = ell.masked_fill(ell == 0, 1.0)
    return (o / ell).to(value.dtype)  # (..., Lq, Dv)
