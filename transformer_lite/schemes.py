"""Every position scheme in one table (chapters 4 and 9).

A scheme is described once, here: whether it is absolute (added to the
embeddings) or relative (inside every self-attention), how it enters
attention, whether one module serves a whole stack, whether it is a
table of ``max_len`` rows, what the head width must satisfy, whether
the ONNX export takes it, and what it learns. Every place that used to
switch on the name (the configs' checks, the models' builders, the
parameter count, the checkpoint loader, the language model's segment
memory, export and tensor parallelism) asks this table instead.

``POSITIONS`` is the list of names; :func:`scheme` looks one up with a
clear error.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import nn

from transformer_lite.checks import check_heads
from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    RelativePosition,
    SinusoidalPositionalEncoding,
)
from transformer_lite.relative import (
    ALiBiBias,
    ShawRelativeKeys,
    T5RelativeBias,
)
from transformer_lite.rotary import RotaryEmbedding

__all__ = [
    "POSITIONS",
    "SCHEMES",
    "PositionScheme",
    "absolute_positions",
    "check_widths",
    "relative_positions",
    "scheme",
]

T5_BUCKETS, T5_DISTANCE = 32, 128  # T5's buckets and max_distance
SHAW_DISTANCE = 16  # Shaw et al.'s clipping distance k


class Sizes(Protocol):
    """What a scheme reads of a model's config (``TransformerConfig``,
    ``LMConfig``, ...)."""

    d_model: int
    n_heads: int
    n_layers: int
    max_len: int
    dropout: float
    position: str


# A relative scheme's module for each layer of a stack, given the sizes
# and whether the stack is causal (T5's buckets are one-sided there).
LayerModules = Callable[[Sizes, bool], list[RelativePosition]]


@dataclass(frozen=True)
class PositionScheme:
    """One position scheme, described.

    Attributes:
        name: the value of a config's ``position``.
        enters: where it acts, in words.
        absolute: added to the embeddings (else inside self-attention).
        table: holds a row per position up to ``max_len`` (a segment
            memory, whose tokens sit at shifted offsets, cannot use it).
        shared: one module serves every layer of a stack.
        even_heads: the head width d_model / n_heads must be even.
        exportable: the ONNX export of chapter 12 takes it.
        embedding: the class of the module added to the embeddings
            (absolute schemes; None for relative ones).
        layers: the modules for a stack's layers (relative schemes).
        learned: parameters per stack, from (d_model, n_heads, n_layers,
            max_len); None: it learns nothing.
        built: tensor elements the model builds that no checkpoint
            stores, from (d_model, max_len) (the sinusoidal table,
            computed on building); None: nothing.
    """

    name: str
    enters: str
    absolute: bool
    table: bool = False
    shared: bool = False
    even_heads: bool = False
    exportable: bool = False
    embedding: type[nn.Module] | None = None
    layers: LayerModules | None = None
    learned: Callable[[int, int, int, int], int] | None = None
    built: Callable[[int, int], int] | None = None

    def parameters(self, c: Sizes, stacks: int) -> int:
        """What the scheme learns in a model of ``stacks`` stacks (an
        absolute table is one for the whole model)."""
        if self.learned is None:
            return 0
        per_stack = self.learned(c.d_model, c.n_heads, c.n_layers, c.max_len)
        return per_stack if self.absolute else stacks * per_stack

    def elements_built(self, d_model: int, max_len: int) -> int:
        """Tensor elements built and not stored in a checkpoint."""
        return 0 if self.built is None else self.built(d_model, max_len)


def _t5(c: Sizes, causal: bool) -> list[RelativePosition]:
    table = T5RelativeBias(
        c.n_heads,
        bidirectional=not causal,
        n_buckets=T5_BUCKETS,
        max_distance=T5_DISTANCE,
    )
    return [table] * c.n_layers


def _shaw(c: Sizes, causal: bool) -> list[RelativePosition]:
    d_k = c.d_model // c.n_heads
    return [ShawRelativeKeys(d_k, SHAW_DISTANCE) for _ in range(c.n_layers)]


SCHEMES: dict[str, PositionScheme] = {
    s.name: s
    for s in (
        PositionScheme(
            "sinusoidal",
            "a fixed table of sines added to the embeddings",
            absolute=True,
            table=True,
            exportable=True,
            embedding=SinusoidalPositionalEncoding,
            built=lambda d, L: L * d,
        ),
        PositionScheme(
            "learned",
            "a learned table added to the embeddings",
            absolute=True,
            table=True,
            exportable=True,
            embedding=LearnedPositionalEmbedding,
            learned=lambda d, h, n, L: L * d,
        ),
        PositionScheme(
            "none",
            "nothing: attention sees a set",
            absolute=True,
            exportable=True,
            embedding=NoPositionalEncoding,
        ),
        PositionScheme(
            "rope",
            "rotates queries and keys by their positions",
            absolute=False,
            shared=True,
            even_heads=True,
            layers=lambda c, causal: (
                [RotaryEmbedding(c.d_model // c.n_heads)] * c.n_layers
            ),
        ),
        PositionScheme(
            "alibi",
            "a fixed bias on the scores, linear in the distance",
            absolute=False,
            shared=True,
            layers=lambda c, causal: [ALiBiBias(c.n_heads)] * c.n_layers,
        ),
        PositionScheme(
            "t5",
            "a learned bias on the scores per bucket of offsets",
            absolute=False,
            shared=True,
            layers=_t5,
            learned=lambda d, h, n, L: T5_BUCKETS * h,
        ),
        PositionScheme(
            "shaw",
            "a learned vector per clipped offset, added to the keys",
            absolute=False,
            layers=_shaw,
            learned=lambda d, h, n, L: n * (2 * SHAW_DISTANCE + 1) * (d // h),
        ),
    )
}
POSITIONS = tuple(SCHEMES)


def scheme(position: str) -> PositionScheme:
    """The scheme called ``position``; a clear ``ValueError`` otherwise."""
    if position not in SCHEMES:
        raise ValueError(
            f"position must be one of {', '.join(POSITIONS)}; got {position!r}"
        )
    return SCHEMES[position]


def check_widths(d_model: int, n_heads: int, position: str) -> None:
    """Raise a ``ValueError`` unless ``position`` is a scheme and
    ``d_model`` splits into ``n_heads`` heads (and is even, for the
    sinusoidal table; each head even where the scheme rotates pairs)."""
    s = scheme(position)
    check_heads(d_model, n_heads)
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    if s.even_heads and (d_model // n_heads) % 2:
        raise ValueError(
            f"position={position!r} rotates pairs: the head size d_model / "
            f"n_heads must be even, got {d_model // n_heads}"
        )


def absolute_positions(config: Sizes) -> nn.Module:
    """The module that adds positions to the embeddings (and applies
    dropout): the sinusoidal table, a learned one, or nothing."""
    c = config
    kind = scheme(c.position).embedding or NoPositionalEncoding  # relative
    return kind(c.d_model, c.dropout, c.max_len)


def relative_positions(
    config: Sizes, *, causal: bool
) -> list[RelativePosition | None]:
    """One relative scheme per layer of a stack, for its self-attention
    (``causal``: the decoder's), or ``None`` per layer for an absolute
    scheme. RoPE, ALiBi and T5 share one module within a stack; Shaw's
    tables are one per layer, as in the paper."""
    s = scheme(config.position)
    if s.layers is None:
        return [None] * config.n_layers
    return s.layers(config, causal)
