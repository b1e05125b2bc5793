"""The full encoder-decoder Transformer (chapter 5).

``make_model(src_vocab, tgt_vocab)`` builds the paper's base model; a
:class:`TransformerConfig` names every choice, among them where positions
enter the model (``position``: a scheme of
:mod:`transformer_lite.schemes`; chapter 9).
"""

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from transformer_lite.cache import DecoderCache
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.layers import Decoder, Encoder, glorot_init
from transformer_lite.masks import padding_mask, target_mask
from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    RelativePosition,
)
from transformer_lite.schemes import (
    absolute_positions,
    check_widths,
    relative_positions,
    scheme,
)
from transformer_lite.tokens import check_ids_here, check_token_tensor

__all__ = [
    "ModelBasics",
    "TextDecoding",
    "Transformer",
    "TransformerConfig",
    "make_model",
]


@dataclass
class TransformerConfig:
    """Every size and switch of a :class:`Transformer`.

    The defaults are the paper's base model (Vaswani et al., 2017, Table 3).
    """

    src_vocab: int  # V_src, the number of source token ids
    tgt_vocab: int  # V_tgt, the number of target token ids
    n_layers: int = 6  # N, layers in the encoder and in the decoder
    d_model: int = 512  # C, width of every residual stream
    d_ff: int = 2048  # inner width of the feed-forward networks
    n_heads: int = 8  # H, attention heads; must divide d_model
    dropout: float = 0.1  # P_drop, one rate for every dropout
    norm_first: bool = False  # False: post-LN (paper); True: pre-LN
    tie_embeddings: bool = False  # share src/tgt embeddings and the output
    max_len: int = 5000  # longest sequence (the size of a position table)
    pad_id: int = 0  # the padding token id, the same in both vocabularies
    position: str = "sinusoidal"  # where positions enter: schemes.POSITIONS

    def __post_init__(self) -> None:
        for name in (
            "src_vocab",
            "tgt_vocab",
            "n_layers",
            "d_model",
            "d_ff",
            "n_heads",
            "max_len",
        ):
            check_int(name, getattr(self, name), low=1)
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_bool("norm_first", self.norm_first)
        check_bool("tie_embeddings", self.tie_embeddings)
        check_int("pad_id", self.pad_id)
        check_widths(self.d_model, self.n_heads, self.position)
        for name in ("src_vocab", "tgt_vocab"):
            if not 0 <= self.pad_id < getattr(self, name):
                raise ValueError(
                    f"pad_id {self.pad_id} is outside the vocabulary "
                    f"({name}={getattr(self, name)})"
                )
        if self.tie_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                "tie_embeddings needs one shared vocabulary, got "
                f"src_vocab={self.src_vocab} and tgt_vocab={self.tgt_vocab}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    def n_parameters(self) -> int:
        """The parameters of the model this config builds, counted
        without building it (equal to ``count_parameters()``)."""
        d, f, N = self.d_model, self.d_ff, self.n_layers
        attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O and biases
        feed_forward = d * f + f + f * d + d
        norm = 2 * d  # LayerNorm weight and bias
        encoder = N * (attention + feed_forward + 2 * norm)
        decoder = N * (2 * attention + feed_forward + 3 * norm)
        final_norms = 2 * norm if self.norm_first else 0
        embeddings = (self.src_vocab + self.tgt_vocab) * d
        generator = self.tgt_vocab * d + self.tgt_vocab
        if self.tie_embeddings:  # one matrix serves all three
            embeddings, generator = self.src_vocab * d, self.tgt_vocab
        positions = scheme(self.position).parameters(self, stacks=2)
        layers = encoder + decoder + final_norms
        return layers + embeddings + generator + positions


class ModelBasics:
    """What every model of the book answers: its trainable parameters
    and the device its weights are on."""

    def count_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


class TextDecoding(ModelBasics):
    """The text side of chapter 5's model, shared by every model that
    writes words with its ``decoder`` (the :class:`Transformer`, and
    chapter 11's image reader): checked target ids, their embedding
    (:meth:`embed_target`, the model's own), the decoder over a memory,
    with or without a key/value cache.

    Needs ``config`` (``tgt_vocab``, ``pad_id``, ``n_layers``),
    ``decoder``, ``check_ids`` and :meth:`embed_target`.
    """

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        """Target ids (B, T) -> vectors (B, T, C), positions from
        ``offset``."""
        raise NotImplementedError

    def _check_tokens(self, tokens: Tensor, vocab: int, name: str) -> None:
        """Shape and dtype always; the ids' range on the CPU outside a
        compiled graph, and elsewhere when ``check_ids`` is set (it reads
        values: a sync point on a GPU, a break in a compiled graph)."""
        check_token_tensor(tokens, name)
        if tokens.numel() == 0:
            raise ValueError(f"{name} is empty: shape {tuple(tokens.shape)}")
        check_ids_here(tokens, vocab, name, always=self.check_ids)

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Memory (B, S, C) and target ids (B, T) -> hidden (B, T, C).

        With a ``cache`` (from :meth:`new_cache`), ``tgt`` holds only the
        next positions; by default they may attend to every cached one.
        A cache serves one ``memory``: another raises a ``ValueError``.
        """
        self._check_tokens(tgt, self.config.tgt_vocab, "tgt")
        if cache is None:
            if tgt_mask is None:
                tgt_mask = target_mask(tgt, self.config.pad_id)  # (B, T, T)
            x = self.embed_target(tgt)  # (B, T, C)
            return self.decoder(x, memory, src_mask, tgt_mask)
        cache.bind(memory)  # one cache, one source
        x = self.embed_target(tgt, cache.length)  # (B, T_new, C)
        hidden = self.decoder(x, memory, src_mask, tgt_mask, cache)
        cache.length += tgt.size(1)
        return hidden

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for incremental decoding (chapter 8)."""
        return DecoderCache.empty(self.config.n_layers)

    def logits(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., C) -> next-token scores (..., V_tgt)."""
        return self.generator(hidden)


class Transformer(TextDecoding, nn.Module):
    """Encoder-decoder Transformer: embeddings (scaled by sqrt(d_model)) plus
    positions, the encoder and decoder stacks, and the output projection
    (``generator``) to logits.

    Masks are optional: when omitted they are built from ``config.pad_id``
    (padding for the source; padding and causal for the target).

    Shape:
        src: (B, S) token ids; tgt: (B, T) token ids;
        src_mask: (B, 1, S); tgt_mask: (B, T, T); output: (B, T, V_tgt).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.check_ids = False  # True: check ids on a GPU, in graphs too
        self.src_embed = nn.Embedding(c.src_vocab, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab, c.d_model)
        self.positional = absolute_positions(c)
        stack = (
            c.n_layers,
            c.d_model,
            c.n_heads,
            c.d_ff,
            c.dropout,
            c.norm_first,
        )
        self.encoder = Encoder(
            *stack, positions=relative_positions(c, causal=False)
        )
        self.decoder = Decoder(
            *stack, positions=relative_positions(c, causal=True)
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab)
        self._init_parameters()
        if c.tie_embeddings:
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight

    def _init_parameters(self) -> None:
        """:func:`~transformer_lite.layers.glorot_init`; position tables
        keep their own start."""
        tables = RelativePosition | LearnedPositionalEmbedding
        glorot_init(self, [n for n, m in self.named_modules()
                           if isinstance(m, tables)])  # fmt: skip

    def embed(
        self, tokens: Tensor, embedding: nn.Embedding, offset: int = 0
    ) -> Tensor:
        """Token embeddings times sqrt(d_model), plus positions (starting at
        ``offset``)."""
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, C)
        return self.positional(x, offset)

    def source_mask(self, src: Tensor) -> Tensor:
        """The mask over the memory: the source's padding, (B, 1, S);
        ``src`` is checked as (B, S) token ids."""
        if not isinstance(src, Tensor) or src.dim() != 2:
            shape = tuple(src.shape) if isinstance(src, Tensor) else type(src)
            raise ValueError(
                f"src must be a (B, S) tensor of token ids, got shape {shape}"
            )
        self._check_tokens(src, self.config.src_vocab, "src")
        return padding_mask(src, self.config.pad_id)  # (B, 1, S)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, C)."""
        self._check_tokens(src, self.config.src_vocab, "src")
        if src_mask is None:
            src_mask = self.source_mask(src)  # (B, 1, S)
        return self.encoder(self.embed(src, self.src_embed), src_mask)

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        """:meth:`embed` with the target embedding."""
        return self.embed(tgt, self.tgt_embed, offset)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        if src.dim() == 2 and tgt.dim() == 2 and src.size(0) != tgt.size(0):
            raise ValueError(
                f"src and tgt must share the batch size, got "
                f"{tuple(src.shape)} and {tuple(tgt.shape)}"
            )
        if src_mask is None:
            src_mask = self.source_mask(src)  # (B, 1, S)
        memory = self.encode(src, src_mask)  # (B, S, C)
        hidden = self.decode(memory, src_mask, tgt, tgt_mask)  # (B, T, C)
        return self.logits(hidden)  # (B, T, V_tgt)


def make_model(src_vocab: int, tgt_vocab: int, **config_fields) -> Transformer:
    """Build a :class:`Transformer`; keyword arguments are
    :class:`TransformerConfig` fields (defaults: the paper's base model)."""
    return Transformer(
        TransformerConfig(src_vocab, tgt_vocab, **config_fields)
    )
