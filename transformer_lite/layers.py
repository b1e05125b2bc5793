"""Feed-forward blocks, encoder and decoder layers and stacks (chapter 5).

Each sublayer is wrapped in a residual connection and a LayerNorm, placed
in one of two ways (one flag, ``norm_first``, as in PyTorch):

* post-LN (the paper, ``norm_first=False``): ``x = LayerNorm(x + f(x))``
* pre-LN (the Annotated Transformer's code, ``norm_first=True``):
  ``x = x + f(LayerNorm(x))``, with a final LayerNorm after the stack.

A relative position scheme (chapter 9) is given to each layer's
self-attention; cross-attention has none (a target position and a
source position have no offset that means anything).
"""

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from transformer_lite.attention import MultiHeadAttention
from transformer_lite.cache import DecoderCache, KVCache, LayerCache
from transformer_lite.checks import check_bool, check_real
from transformer_lite.positional import RelativePosition

__all__ = [
    "ACTIVATIONS",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "activation_module",
    "check_activation",
    "check_norm_eps",
    "glorot_init",
]

LAYER_NORM_EPS = 1e-5  # as nn.LayerNorm and nn.TransformerEncoderLayer

# The feed-forward network's nonlinearity, by name: ReLU in the paper;
# GELU (the exact, erf form) in BERT; GELU's tanh approximation in GPT-2.
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


def check_norm_eps(norm_eps: object) -> float:
    """``norm_eps`` as a float if it is a positive finite number."""
    eps = check_real("norm_eps", norm_eps, low=0.0)
    if eps == 0.0:
        raise ValueError(
            "norm_eps must be positive: a LayerNorm of a constant vector "
            "divides by sqrt(0 + norm_eps)"
        )
    return eps


def check_activation(name: object) -> str:
    """``name`` if it is one of :data:`ACTIVATIONS`."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}"
        )
    return name


def activation_module(name: str) -> nn.Module:
    """The module of the activation ``name`` (one of :data:`ACTIVATIONS`)."""
    modules = {
        "relu": nn.ReLU,
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    }
    return modules[check_activation(name)]()


def glorot_init(model: nn.Module, keep: Sequence[str] = ()) -> None:
    """The start of every model of the book: Glorot-uniform for every
    matrix, zero for every bias, LayerNorm weights left at one.

    ``keep``: the names of the modules or parameters that keep their
    own start, such as position tables or a class token. The parameters
    are visited in ``named_parameters`` order, so a seed gives one model.
    """
    kept = set(keep)
    below = tuple(f"{name}." for name in keep)
    for name, p in model.named_parameters():
        if name in kept or name.startswith(below):
            continue
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


class FeedForward(nn.Module):
    """Position-wise feed-forward network: max(0, x W1 + b1) W2 + b2.

    Args:
        d_model: model width C.
        d_ff: inner width (2048 in the paper's base model).
        dropout: dropout after the activation.
        activation: the nonlinearity, max(0, .) in the paper; one of
            :data:`ACTIVATIONS` (BERT and GPT-2 use GELU, chapter 13).
        inner_dropout: False: no dropout inside the network, as in
            GPT-2 and BERT (the reference code of the paper and PyTorch's
            layers drop the activations before W2).

    Shape:
        x: (B, L, C); output: (B, L, C).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.1,
        *,
        activation: str = "relu",
        inner_dropout: bool = True,
    ) -> None:
        super().__init__()
        check_bool("inner_dropout", inner_dropout)
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = activation_module(activation)
        self.dropout = nn.Dropout(dropout) if inner_dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.w_1(x))  # (B, L, d_ff)
        return self.w_2(self.dropout(hidden))  # (B, L, C)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each with residual and LayerNorm.

    Args:
        d_model: model width C.
        n_heads: attention heads H.
        d_ff: feed-forward inner width.
        dropout: dropout on attention weights, after the ReLU, and on each
            sublayer's output before the residual sum.
        norm_first: False for the paper's post-LN, True for pre-LN.
        position: the self-attention's relative position scheme, or None.
        activation: the feed-forward network's (:data:`ACTIVATIONS`).
        inner_dropout: whether the feed-forward network drops its
            activations (:class:`FeedForward`; GPT-2 and BERT: False).
        norm_eps: the LayerNorms' epsilon (BERT's is 1e-12).

    The same layer under a causal mask (``is_causal=True``) is the block
    of a decoder-only language model (chapter 10), which also passes a
    key/value ``cache`` when generating, or Transformer-XL's ``segment``
    of earlier hidden states.

    Shape:
        x: (B, S, C); mask: (B, 1, S) or (B, S, S); output: (B, S, C).
        With a segment of M positions, mask: (B, 1 or S, M + S).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        *,
        position: RelativePosition | None = None,
        activation: str = "relu",
        inner_dropout: bool = True,
        norm_eps: float = LAYER_NORM_EPS,
    ) -> None:
        super().__init__()
        check_norm_eps(norm_eps)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout, position=position
        )
        self.feed_forward = FeedForward(
            d_model,
            d_ff,
            dropout,
            activation=activation,
            inner_dropout=inner_dropout,
        )
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _attend(
        self,
        x: Tensor,
        mask: Tensor | None,
        segment: Tensor | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        kv = x if segment is None else torch.cat([segment, x], dim=1)
        # kv: (B, M + L, C), the positions x attends to
        y = self.self_attn(x, kv, kv, mask, cache, is_causal=is_causal)
        return self.dropout1(y)

    def _feed(self, x: Tensor) -> Tensor:
        return self.dropout2(self.feed_forward(x))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        segment: Tensor | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """``segment``: the previous segment's inputs to this layer
        (Transformer-XL's memory), attended before ``x``; ``cache``: the
        keys and values of earlier positions (generation); ``is_causal``:
        see :meth:`MultiHeadAttention.forward`."""
        if segment is not None and cache is not None:
            raise ValueError("pass a segment or a cache, not both")
        if self.norm_first:
            m = None if segment is None else self.norm1(segment)
            x = x + self._attend(self.norm1(x), mask, m, cache, is_causal)
            x = x + self._feed(self.norm2(x))
        else:
            x = self.norm1(
                x + self._attend(x, mask, segment, cache, is_causal)
            )
            x = self.norm2(x + self._feed(x))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder's memory,
    then feed-forward; each with residual and LayerNorm.

    Args: as :class:`EncoderLayer`.

    Shape:
        x: (B, T, C); memory: (B, S, C); src_mask: (B, 1, S);
        tgt_mask: (B, T, T) or (1, T, T); output: (B, T, C).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        *,
        position: RelativePosition | None = None,
        activation: str = "relu",
        inner_dropout: bool = True,
        norm_eps: float = LAYER_NORM_EPS,
    ) -> None:
        super().__init__()
        check_norm_eps(norm_eps)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout, position=position
        )
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(
            d_model,
            d_ff,
            dropout,
            activation=activation,
            inner_dropout=inner_dropout,
        )
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _attend(self, x, mask, cache: LayerCache | None) -> Tensor:
        kv_cache = None if cache is None else cache.self_attn
        return self.dropout1(self.self_attn(x, x, x, mask, kv_cache))

    def _cross(self, x, memory, mask, cache: LayerCache | None) -> Tensor:
        kv_cache = None if cache is None else cache.cross_attn
        return self.dropout2(
            self.cross_attn(x, memory, memory, mask, kv_cache)
        )

    def _feed(self, x: Tensor) -> Tensor:
        return self.dropout3(self.feed_forward(x))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """With a ``cache``, ``x`` holds only the new positions."""
        if self.norm_first:
            x = x + self._attend(self.norm1(x), tgt_mask, cache)
            x = x + self._cross(self.norm2(x), memory, src_mask, cache)
            x = x + self._feed(self.norm3(x))
        else:
            x = self.norm1(x + self._attend(x, tgt_mask, cache))
            x = self.norm2(x + self._cross(x, memory, src_mask, cache))
            x = self.norm3(x + self._feed(x))
        return x


class _Stack(nn.Module):
    """``n_layers`` copies of ``layer_type`` and, in pre-LN, a final
    LayerNorm: what :class:`Encoder` and :class:`Decoder` share.

    ``activation``, ``inner_dropout`` and ``norm_eps`` are each
    layer's (``norm_eps`` the final LayerNorm's too). ``positions``: one
    relative position scheme per layer (or None). A scheme shared by
    the layers, as T5's table, is the same module in every place:
    ``parameters()`` yields it once, and the state dict names it in each
    layer, as it does tied embeddings.
    """

    layer_type: type[nn.Module]

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        *,
        positions: Sequence[RelativePosition | None] | None = None,
        activation: str = "relu",
        inner_dropout: bool = True,
        norm_eps: float = LAYER_NORM_EPS,
    ) -> None:
        super().__init__()
        positions = [None] * n_layers if positions is None else positions
        if len(positions) != n_layers:
            raise ValueError(
                f"positions must hold one scheme (or None) per layer: "
                f"{n_layers}, got {len(positions)}"
            )
        self.layers = nn.ModuleList(
            self.layer_type(
                d_model,
                n_heads,
                d_ff,
                dropout,
                norm_first,
                position=position,
                activation=activation,
                inner_dropout=inner_dropout,
                norm_eps=norm_eps,
            )
            for position in positions
        )
        self.norm = nn.LayerNorm(d_model, eps=norm_eps) if norm_first else None
        self.checkpointing = False


class Encoder(_Stack):
    """A stack of ``n_layers`` encoder layers.

    With ``norm_first=True`` a final LayerNorm normalises the output (pre-LN
    layers leave the residual stream un-normalised); post-LN needs none.

    Attributes:
        checkpointing: recompute each layer's activations in the backward
            pass instead of storing them (less memory, more time; chapter 8).

    Shape:
        x: (B, S, C); mask: (B, 1, S); output: (B, S, C).
    """

    layer_type = EncoderLayer

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            if self.checkpointing and self.training:
                x = checkpoint(layer, x, mask, use_reentrant=False)
            else:
                x = layer(x, mask)
        return x if self.norm is None else self.norm(x)


class Decoder(_Stack):
    """A stack of ``n_layers`` decoder layers (see :class:`Encoder`).

    Shape:
        x: (B, T, C); memory: (B, S, C); src_mask: (B, 1, S);
        tgt_mask: (B, T, T); output: (B, T, C).
    """

    layer_type = DecoderLayer

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """With a ``cache`` (incremental decoding), ``x`` holds only the
        new positions and the cache grows by them."""
        for i, layer in enumerate(self.layers):
            if cache is not None:
                x = layer(x, memory, src_mask, tgt_mask, cache.layers[i])
            elif self.checkpointing and self.training:
                x = checkpoint(
                    layer, x, memory, src_mask, tgt_mask, use_reentrant=False
                )
            else:
                x = layer(x, memory, src_mask, tgt_mask)
        return x if self.norm is None else self.norm(x)
