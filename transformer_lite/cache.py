"""Key/value caches for incremental decoding (chapter 8).

Generating token t with a plain decoder recomputes the keys and values of
tokens 0..t-1 at every step, so n steps cost O(n^2) projections. A cache
keeps them: each step projects only the new token and appends its keys and
values; the cross-attention keys and values of the encoder memory are
computed once.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["DecoderCache", "KVCache", "LayerCache", "StackCache"]


@dataclass
class KVCache:
    """Keys and values of one attention module, already split into heads.

    Args:
        static: True for cross-attention (keys and values come from the
            encoder memory and are computed once); False for
            self-attention (each step appends the new position's).

    Shape:
        key, value: (B, H, L, D), or None before the first step.
    """

    static: bool = False
    key: Tensor | None = None
    value: Tensor | None = None

    @property
    def length(self) -> int:
        """How many positions the cache holds (0 before the first step)."""
        return 0 if self.key is None else self.key.size(2)

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Store (static) or append (self-attention) new keys and values and
        return everything cached so far."""
        if self.key is None or self.static:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=2)  # (B, H, L+1, D)
            self.value = torch.cat([self.value, value], dim=2)
        return self.key, self.value

    def select(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (in that order), e.g. for beam search."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


@dataclass
class LayerCache:
    """The two caches of one decoder layer."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=lambda: KVCache(static=True))


@dataclass
class DecoderCache:
    """Caches of every decoder layer, and how many positions they hold.

    A cache belongs to one source: the cross-attention keys and values
    are computed from the first ``memory`` it sees, and :meth:`bind`
    refuses any other (a new source needs a new cache).
    """

    layers: list[LayerCache]
    length: int = 0
    memory: Tensor | None = None  # the encoder output it was built on

    def bind(self, memory: Tensor) -> None:
        """Remember ``memory`` on the first step; raise a ``ValueError``
        if a later step passes another tensor."""
        if self.memory is None:
            self.memory = memory
        elif memory is not self.memory:
            raise ValueError(
                "this cache holds the cross-attention keys and values of "
                "another memory (source); start each source with a new "
                "cache, model.new_cache()"
            )

    @classmethod
    def empty(cls, n_layers: int) -> "DecoderCache":
        return cls([LayerCache() for _ in range(n_layers)])

    def select(self, index: Tensor) -> None:
        """Reorder or subset the batch of every layer's cache."""
        for layer in self.layers:
            layer.self_attn.select(index)
            layer.cross_attn.select(index)


@dataclass
class StackCache:
    """The self-attention caches of a decoder-only stack (the language
    model, chapter 10): one :class:`KVCache` per block, and how many
    positions they hold. No source, so no cross-attention half."""

    layers: list[KVCache]
    length: int = 0

    @classmethod
    def empty(cls, n_layers: int) -> "StackCache":
        return cls([KVCache() for _ in range(n_layers)])

    def select(self, index: Tensor) -> None:
        """Reorder or subset the batch of every block's cache."""
        for layer in self.layers:
            layer.select(index)
