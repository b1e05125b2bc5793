"""Scaled dot-product attention and multi-head attention (chapters 1 and 3).

.. math::

    \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\!\\left(
        \\frac{Q K^\\top}{\\sqrt{d_k}}\\right) V

Masks follow the package convention: bool, True = may attend. A relative
position scheme (chapter 9) enters through
:class:`~transformer_lite.positional.RelativePosition`: it rotates the
queries and keys, or adds a ``bias`` to the scores, in every path.
"""

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.cache import KVCache
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.masks import causal_mask, check_mask
from transformer_lite.positional import RelativePosition

__all__ = [
    "MultiHeadAttention",
    "fused_attention",
    "scaled_dot_product_attention",
    "set_fused_attention",
]


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


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
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


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: nn.Module | None = None,
    *,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, one operation per line.

    A query row whose mask allows no key gets all-zero weights and a zero
    output instead of NaN, in every floating dtype. Q is divided by
    sqrt(d_k) before the product and the scores are kept in float32 for
    16-bit inputs, so no input that PyTorch's fused kernel handles
    overflows here.

    Args:
        query, key, value: the three inputs; leading dimensions (batch,
            heads) are shared.
        mask: bool, True = may attend; must broadcast to (..., Lq, Lk).
        dropout: applied to the attention weights (e.g. ``nn.Dropout``);
            ``None`` means no dropout.
        bias: added to the scaled scores before the mask (a relative
            position bias, chapter 9); must broadcast to (..., Lq, Lk).

    Shape:
        query: (..., Lq, D); key: (..., Lk, D); value: (..., Lk, Dv);
        output: (..., Lq, Dv); weights: (..., Lq, Lk).
    """
    _check_qkv(query, key, value)
    d_k = query.size(-1)
    # Scale first, then multiply, in float32 (or float64): Q K^T alone can
    # pass float16's largest value, 65504, where Q K^T / sqrt(d_k) does
    # not, and bfloat16's 8 bits would blur scores that softmax amplifies.
    with full_precision(query.device):
        q = query.to(score_dtype(query.dtype)) / math.sqrt(d_k)
        k = key.to(q.dtype)
        scores = q @ k.transpose(-2, -1)  # (..., Lq, Lk)
    if mask is not None:
        check_mask(mask, scores.shape)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
        # A bias of -inf forbids a key as the mask does: a row that it
        # forbids entirely is then empty (zeros), not NaN.
        kept = scores != -math.inf  # (..., Lq, Lk); NaN is kept, and shows
        mask = kept if mask is None else mask & kept
    if mask is not None:
        # The most negative finite number, not -inf: a row with no allowed
        # key then softmaxes to a finite (uniform) row instead of NaN ...
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        # ... which is zeroed here, as are the (already ~0) masked entries.
        weights = weights.masked_fill(~mask, 0.0)
    weights = weights.to(value.dtype)  # as the fused kernels multiply V
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (..., Lq, Dv), (..., Lq, Lk)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with four projections written out.

    .. math::

        \\mathrm{head}_i = \\mathrm{Attention}(Q W^Q_i, K W^K_i, V W^V_i),
        \\quad \\mathrm{MHA} = \\mathrm{Concat}(\\mathrm{head}_1, \\dots,
        \\mathrm{head}_H)\\, W^O

    Args:
        d_model: model width C.
        n_heads: number of heads H; must divide ``d_model``.
        dropout: dropout on the attention weights; 0.0 means none.
        bias: whether the four projections have a bias.
        fused: compute attention with PyTorch's fused
            ``F.scaled_dot_product_attention`` (memory-efficient or
            cuDNN kernels on a GPU; CUDA's flash kernel takes no mask)
            instead of the hand-written function.
        position: a relative position scheme for self-attention (RoPE,
            ALiBi, T5, Shaw; chapter 9), or None. One module may serve
            several layers (T5 shares its table within a stack).

    Attributes:
        keep_weights: when True, the last forward pass stores its attention
            weights, detached, in ``self.weights`` (B, H, Lq, Lk) for
            visualisation. Off by default, so no activations are kept alive.

    Shape:
        query: (B, Lq, C); key, value: (B, Lk, C); mask: (B, Lq, Lk),
        (B, 1, Lk), (Lq, Lk) or with a head axis (B, H or 1, Lq, Lk);
        output: (B, Lq, C). With a ``cache``, Lk counts the cached keys too.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.1,
        bias: bool = True,
        fused: bool = False,
        *,
        position: RelativePosition | None = None,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model, low=1)
        check_int("n_heads", n_heads, low=1)
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of "
                f"n_heads ({n_heads})"
            )
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_bool("bias", bias)
        check_bool("fused", fused)
        if position is not None and not isinstance(position, RelativePosition):
            raise ValueError(
                "position must be a RelativePosition (RoPE, ALiBi, T5, "
                f"Shaw) or None, got {type(position).__name__}"
            )
        self.d_model = d_model
        self.h = n_heads
        self.d_k = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout_p = dropout
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.fused = fused
        self.position = position
        self.keep_weights = False
        self.weights: Tensor | None = None

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, L, D).

        The heads are counted from ``x`` (C / D), not taken from ``h``:
        under tensor parallelism (chapter 12) a process holds a slice of
        the columns of W^Q, W^K and W^V, so C and H are its share.
        """
        B, L, C = x.shape
        x = x.view(B, L, C // self.d_k, self.d_k)  # (B, L, H, D)
        return x.transpose(1, 2)  # (B, H, L, D)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, D) -> (B, L, C), C = H D (a share of the heads
        under tensor parallelism, as in :meth:`split_heads`)."""
        B, H, L, D = x.shape
        x = x.transpose(1, 2)  # (B, L, H, D)
        return x.reshape(B, L, H * D)  # (B, L, C)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor):
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3 or x.size(-1) != self.d_model:
                raise ValueError(
                    f"{name} must have shape (B, L, d_model={self.d_model}), "
                    f"got {tuple(x.shape)}"
                )
        if not query.size(0) == key.size(0) == value.size(0):
            raise ValueError(
                "query, key and value must share the batch size, got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, "
                f"{tuple(value.shape)}"
            )
        if key.size(1) != value.size(1):
            raise ValueError(
                f"key and value must have the same length, got "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        if self.position is not None and key.size(1) < query.size(1):
            raise ValueError(
                "a relative position scheme serves self-attention: the "
                "queries are the last positions of the keys, got "
                f"{tuple(query.shape)} and {tuple(key.shape)}"
            )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        *,
        is_causal: bool = False,
    ) -> Tensor:
        """Attend from ``query`` to ``key``/``value``.

        ``cache`` (incremental decoding, chapter 8): a self-attention cache
        appends the new keys and values and attends over all of them; a
        static (cross-attention) cache projects ``key``/``value`` on the
        first call only and reuses them afterwards.

        ``is_causal``: the Lq queries are the last Lq of the Lk positions
        (the first Lk - Lq are cached keys or a segment memory), and each
        may also attend only to the keys at or before its own position,
        on top of ``mask`` if one is given. With ``fused``, no other mask
        and Lq = Lk, the fused kernel is told so instead of being given a
        mask, which lets a GPU run FlashAttention; with Lq < Lk the mask
        is spelled out (the kernel's own alignment is Lq = Lk's), and one
        new query (Lq = 1) needs none.

        With a ``position`` scheme, the new keys sit at positions
        t .. t + L - 1, t being the number of cached keys (0 without a
        cache), and the queries at the last Lq of them; the cached keys
        keep theirs. (A segment memory comes in as the first L - Lq of
        the new keys.)
        """
        self._check_inputs(query, key, value)
        q = self.split_heads(self.w_q(query))  # (B, H, Lq, D)
        t = 0 if cache is None else cache.length  # positions held already
        if self.position is not None:  # self-attention: Lk = t + L
            positions = torch.arange(t + key.size(1), device=q.device)
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value  # (B, H, Lk, D), computed once
        else:
            k = self.split_heads(self.w_k(key))  # (B, H, Lk, D)
            v = self.split_heads(self.w_v(value))  # (B, H, Lk, D)
            if self.position is not None:  # keys are cached rotated
                k = self.position.rotate(k, positions[t:])
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H, L_cached + Lk, D)
        bias = None
        if self.position is not None:  # the queries: the last Lq
            q = self.position.rotate(q, positions[-q.size(2) :])
            bias = self.position.bias(q, positions[-q.size(2) :], positions)
        B, H, Lq, _ = q.shape  # H: all heads, or a share (chapter 12)
        if mask is not None:
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)  # (B, 1, Lq or 1, Lk): heads share
            check_mask(mask, torch.Size((B, H, Lq, k.size(2))))
        Lk = k.size(2)
        if is_causal and Lq > Lk:
            raise ValueError(
                f"is_causal needs at least as many keys as queries, got "
                f"Lq={Lq} and Lk={Lk}"
            )
        if is_causal and Lq < Lk:
            # The kernel's is_causal lets query i see keys 0..i (top-left);
            # here query i sits at position Lk - Lq + i (bottom-right).
            if Lq > 1:
                past = causal_mask(Lk, q.device)[None, :, Lk - Lq :]
                # past: (1, 1, Lq, Lk), a shape every fused kernel takes
                mask = past if mask is None else mask & past
            is_causal = False
        if self.fused and not self.keep_weights:
            # (B, H, Lq, D), as the plain path's output below
            x = self._fused_attention(q, k, v, mask, is_causal, bias)
        else:
            if is_causal:
                future = causal_mask(Lq, q.device)  # (1, Lq, Lk)
                mask = future if mask is None else mask & future
            dropout = self.dropout if self.training else None
            x, weights = scaled_dot_product_attention(
                q, k, v, mask, dropout, bias=bias
            )
            if self.keep_weights:
                self.weights = weights.detach()  # (B, H, Lq, Lk)
        return self.w_o(self.merge_heads(x))  # (B, Lq, C)

    def _fused_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool = False,
        bias: Tensor | None = None,
    ) -> Tensor:
        p = self.dropout_p if self.training else 0.0
        return fused_attention(
            q, k, v, mask, dropout_p=p, is_causal=is_causal, bias=bias
        )


def fused_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    bias: Tensor | None = None,
) -> Tensor:
    """PyTorch's fused ``F.scaled_dot_product_attention`` with the
    package's rule for a query row whose mask allows no key: a zero
    output, as :func:`scaled_dot_product_attention` gives.

    No mask at all (none, or causal alone, given as ``is_causal``) lets
    a GPU choose FlashAttention, which takes no mask tensor. A ``bias``
    (chapter 9) goes to the kernel as a float mask, with -inf where the
    bool mask forbids a key.

    Shape:
        as :func:`scaled_dot_product_attention`; output: (..., Lq, Dv).
    """
    if mask is None and bias is None:
        return F.scaled_dot_product_attention(
            query, key, value, dropout_p=dropout_p, is_causal=is_causal
        )
    if is_causal:
        future = causal_mask(query.size(-2), query.device)  # (1, Lq, Lk)
        mask = future if mask is None else mask & future  # (B, ., Lq, Lk)
    if (
        bias is not None
    ):  # -inf in the bias forbids a key, as in the plain path
        kept = bias != -math.inf
        mask = kept if mask is None else mask & kept
    # A query row with no allowed key: the kernel sees every key for it
    # (some CUDA kernels give NaN for an empty row, in the backward pass
    # too), and its output is then zeroed, as in the plain path.
    empty = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
    allowed = mask | empty
    if bias is not None:  # the float mask: bias where allowed, else -inf
        allowed = bias.to(query.dtype).masked_fill(~allowed, -math.inf)
    x = F.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, dropout_p=dropout_p
    )
    return x.masked_fill(empty, 0.0)


def set_fused_attention(model: nn.Module, fused: bool = True) -> int:
    """Switch every :class:`~transformer_lite.attention.MultiHeadAttention`
    in ``model`` to PyTorch's fused kernel (``fused=True``) or to the
    hand-written attention; returns how many modules were switched."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for module in modules:
        module.fused = fused
    return len(modules)
