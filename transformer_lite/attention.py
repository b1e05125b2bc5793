"""Scaled dot-product attention and multi-head attention (chapters 1 and 3).

.. math::

    \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\!\\left(
        \\frac{Q K^\\top}{\\sqrt{d_k}}\\right) V

Masks follow the package convention: bool, True = may attend. A relative
position scheme (chapter 9) enters through
:class:`~transformer_lite.positional.RelativePosition`: it rotates the
queries and keys, or adds a ``bias`` to the scores, in every path.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.cache import KVCache
from transformer_lite.checks import (
    check_bool,
    check_heads,
    check_int,
    check_real,
)
from transformer_lite.chunked import chunked_attention
from transformer_lite.masks import causal_mask, check_mask
from transformer_lite.positional import RelativePosition
from transformer_lite.scores import check_qkv, full_precision, scaled_query

__all__ = [
    "KERNELS",
    "MultiHeadAttention",
    "attend",
    "fused_attention",
    "scaled_dot_product_attention",
    "set_attention_kernel",
]

# The three ways to compute the same attention (chapter 8): the
# hand-written formula, PyTorch's fused kernel, the online softmax.
KERNELS = ("plain", "fused", "chunked")


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
    check_qkv(query, key, value)
    # Scale first, then multiply, in float32 (or float64): see
    # transformer_lite.scores.
    with full_precision(query.device):
        q = scaled_query(query)  # Q / sqrt(d_k)
        scores = q @ key.to(q.dtype).transpose(-2, -1)  # (..., Lq, Lk)
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


Bias = Tensor | Callable[[Tensor, Tensor, Tensor], Tensor]


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    bias: Bias | None = None,
    dropout_p: float = 0.0,
    kernel: str = "plain",
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention by the chosen kernel: the one place that knows kernels.

    Every kernel computes softmax(Q K^T / sqrt(d_k) + bias) V with the
    same rules: scores in float32 for 16-bit inputs, Q scaled first; a
    query row that may attend to no key gets a zero output, not NaN.

    ``is_causal``: the Lq queries are the *last* Lq of the Lk positions
    (the first Lk - Lq are cached keys or a segment memory), and each
    attends to the keys at or before its own position, on top of
    ``mask``. The fused kernel is told so only where its own rule (query
    i sees keys 0..i) is the same one: Lq = Lk and no other mask or
    bias, which lets a GPU run FlashAttention. Everywhere else the
    right-aligned mask is spelled out; one query (Lq = 1) needs none.

    Args:
        query, key, value: (..., Lq, D), (..., Lk, D), (..., Lk, Dv).
        mask: bool, True = may attend; broadcasts to (..., Lq, Lk).
        is_causal: as above.
        bias: added to the scaled scores (chapter 9): a tensor that
            broadcasts to (..., Lq, Lk), or, for the chunked kernel, a
            function ``bias(query_block, query_index, key_index)``.
        dropout_p: dropout on the weights (the plain and fused kernels;
            the chunked one forms no weights to drop).
        kernel: ``"plain"`` (:func:`scaled_dot_product_attention`),
            ``"fused"`` (:func:`fused_attention`, PyTorch's kernel) or
            ``"chunked"`` (:func:`~transformer_lite.chunked.chunked_attention`,
            the online softmax).
        need_weights: also return the weights (the plain kernel only).

    Returns:
        the output (..., Lq, Dv) and the weights (..., Lq, Lk), or None
        unless ``need_weights``.
    """
    check_kernel(kernel)
    if need_weights and kernel != "plain":
        raise ValueError(
            f"the {kernel} kernel never forms the weights; ask "
            "kernel='plain' for need_weights=True"
        )
    if dropout_p > 0 and kernel == "chunked":
        raise ValueError(
            "the chunked kernel forms no weights to drop: call it with "
            f"dropout_p=0 (in eval mode), got dropout_p={dropout_p}"
        )
    Lq, Lk = query.size(-2), key.size(-2)
    if is_causal and Lq > Lk:
        raise ValueError(
            f"is_causal needs at least as many keys as queries, got "
            f"Lq={Lq} and Lk={Lk}"
        )
    flash = kernel == "fused" and mask is None and bias is None
    if is_causal and not (flash and Lq == Lk) and Lq > 1:
        # query i sits at position Lk - Lq + i: it sees keys 0..Lk - Lq + i
        past = causal_mask(Lk, query.device)[:, Lk - Lq :]  # (1, Lq, Lk)
        past = past.view((1,) * (query.dim() - 2) + (Lq, Lk))
        mask = past if mask is None else mask & past
    causal = is_causal and flash and Lq == Lk  # the kernel's own rule
    if kernel == "plain":
        dropout = (lambda w: F.dropout(w, dropout_p)) if dropout_p else None
        out, weights = scaled_dot_product_attention(
            query, key, value, mask, dropout, bias=bias
        )
        return out, weights if need_weights else None
    if kernel == "chunked":
        return chunked_attention(query, key, value, mask, bias=bias), None
    check_qkv(query, key, value)
    if mask is not None:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        check_mask(mask, batch + (Lq, Lk))
    out = fused_attention(
        query, key, value, mask, dropout_p, is_causal=causal, bias=bias
    )
    return out, None


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
        kernel: how attention is computed (:func:`attend`): ``"plain"``,
            the hand-written function; ``"fused"``, PyTorch's
            ``F.scaled_dot_product_attention`` (memory-efficient or cuDNN
            kernels on a GPU, FlashAttention where there is no mask);
            ``"chunked"``, the online softmax of chapter 8 (no dropout:
            use it in eval mode, or with ``dropout=0``).
        position: a relative position scheme for self-attention (RoPE,
            ALiBi, T5, Shaw; chapter 9), or None. One module may serve
            several layers (T5 shares its table within a stack).

    Attributes:
        keep_weights: when True, the last forward pass stores its attention
            weights, detached, in ``self.weights`` (B, H, Lq, Lk) for
            visualisation, computed by the plain kernel whatever
            ``kernel`` says (the others never form them). Off by default,
            so no activations are kept alive.

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
        kernel: str = "plain",
        *,
        position: RelativePosition | None = None,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model, low=1)
        check_int("n_heads", n_heads, low=1)
        check_heads(d_model, n_heads)
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_bool("bias", bias)
        check_kernel(kernel)
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
        self.kernel = kernel
        self.position = position
        self.keep_weights = False
        self.weights: Tensor | None = None

    @property
    def why_not_fused(self) -> str:
        """Why a forward pass would not run PyTorch's fused kernel, or ""
        when it would (as ``nn.MultiheadAttention`` explains its fast
        path)."""
        if self.keep_weights:
            return "keep_weights is on: a fused kernel forms no weights"
        if self.kernel != "fused":
            return f"the module's kernel is {self.kernel!r}"
        return ""

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
        """Project, cache, place, attend, merge.

        ``cache`` (incremental decoding, chapter 8): a self-attention cache
        appends the new keys and values and attends over all of them; a
        static (cross-attention) cache projects ``key``/``value`` on the
        first call only and reuses them afterwards.

        ``is_causal``: the queries are the last Lq of the Lk positions
        (after the cached keys, or a segment memory) and see only keys at
        or before their own position, on top of ``mask`` (:func:`attend`).

        With a ``position`` scheme, the new keys sit at positions
        t .. t + L - 1, t being the number of cached keys (0 without a
        cache), and the queries at the last Lq of them; the cached keys
        keep theirs.
        """
        self._check_inputs(query, key, value)
        q = self.split_heads(self.w_q(query))  # (B, H, Lq, D)
        t = 0 if cache is None else cache.length  # positions held already
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value  # (B, H, Lk, D), computed once
        else:
            k = self.split_heads(self.w_k(key))  # (B, H, L, D)
            v = self.split_heads(self.w_v(value))  # (B, H, L, D)
            if self.position is not None:  # keys are cached rotated
                new = torch.arange(t, t + k.size(2), device=k.device)
                k = self.position.rotate(k, new)  # at t .. t + L - 1
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H, t + L, D)
        q, bias = self._place_queries(q, k.size(2))
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, Lq or 1, Lk): heads share
        kernel = "plain" if self.keep_weights else self.kernel
        x, weights = attend(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            bias=bias,
            dropout_p=self.dropout_p if self.training else 0.0,
            kernel=kernel,
            need_weights=self.keep_weights,
        )
        if self.keep_weights:
            self.weights = weights.detach()  # (B, H, Lq, Lk)
        return self.w_o(self.merge_heads(x))  # (B, Lq, C)

    def _place_queries(self, q: Tensor, Lk: int) -> tuple[Tensor, Bias | None]:
        """The queries rotated to their positions, the last Lq of Lk, and
        the scheme's bias (a function of query and key indices for the
        chunked kernel, which asks for it block by block)."""
        if self.position is None:
            return q, None
        keys = torch.arange(Lk, device=q.device)  # (Lk,)
        at = keys[Lk - q.size(2) :]  # (Lq,): the queries' positions
        q = self.position.rotate(q, at)
        if type(self.position).bias is RelativePosition.bias:
            return q, None  # a scheme without a bias (RoPE)
        if self.kernel == "chunked" and not self.keep_weights:
            return q, lambda block, rows, cols: self.position.bias(
                block, at[rows], keys[cols]
            )
        return q, self.position.bias(q, at, keys)


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


def check_kernel(kernel: str) -> None:
    """Raise a clear ``ValueError`` unless ``kernel`` names a kernel."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def set_attention_kernel(model: nn.Module, kernel: str) -> int:
    """Switch every :class:`MultiHeadAttention` in ``model`` to
    ``kernel`` (``"plain"``, ``"fused"`` or ``"chunked"``); returns how
    many modules were switched."""
    check_kernel(kernel)
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for module in modules:
        module.kernel = kernel
    return len(modules)
