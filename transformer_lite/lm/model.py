"""A decoder-only language model (chapter 10).

The block is the encoder's layer of chapter 5, self-attention then
feed-forward, run under the causal mask: position t sees tokens 0..t
and is trained to predict token t + 1. There is no cross-attention and
no encoder. ``make_lm(vocab)`` builds one; an :class:`LMConfig` names
every choice.
"""

import math
from dataclasses import asdict, dataclass

from torch import Tensor, nn

from transformer_lite.attention import check_kernel, set_attention_kernel
from transformer_lite.cache import StackCache
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.layers import (
    LAYER_NORM_EPS,
    EncoderLayer,
    check_activation,
    check_norm_eps,
)
from transformer_lite.lm.memory import SegmentMemory
from transformer_lite.model import ModelBasics
from transformer_lite.schemes import (
    POSITIONS,
    absolute_positions,
    check_widths,
    relative_positions,
    scheme,
)
from transformer_lite.tokens import check_ids_here, check_token_tensor

__all__ = ["LMConfig", "LanguageModel", "make_lm"]


@dataclass
class LMConfig:
    """Every size and switch of a :class:`LanguageModel`.

    The defaults are a small model that trains on a CPU in minutes.
    """

    vocab: int  # V, the number of token ids
    n_layers: int = 2  # N, blocks in the stack
    d_model: int = 128  # C, width of the residual stream
    d_ff: int = 512  # inner width of the feed-forward networks
    n_heads: int = 4  # H, attention heads; must divide d_model
    dropout: float = 0.1  # one rate for every dropout
    norm_first: bool = True  # pre-LN (GPT-2 and later); False: post-LN
    tie_embeddings: bool = True  # the output layer reuses the embedding
    position: str = "rope"  # where positions enter: schemes.POSITIONS
    max_len: int = 4096  # longest sequence the positions cover
    kernel: str = "fused"  # attention.KERNELS; fused: is_causal=True
    # What a published model may differ in (GPT-2: chapter 13)
    activation: str = "relu"  # layers.ACTIVATIONS; GPT-2: "gelu_tanh"
    norm_eps: float = LAYER_NORM_EPS  # every LayerNorm's epsilon
    scale_embeddings: bool = True  # times sqrt(d_model); GPT-2: False
    output_bias: bool = True  # the output layer's bias; GPT-2 has none
    inner_dropout: bool = True  # dropout inside the FFN; GPT-2: none

    def __post_init__(self) -> None:
        for name in ("vocab", "n_layers", "d_model", "d_ff", "n_heads"):
            check_int(name, getattr(self, name), low=1)
        check_int("max_len", self.max_len, low=1)
        check_real("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        flags = ("norm_first", "tie_embeddings", "scale_embeddings",
                 "output_bias", "inner_dropout")  # fmt: skip
        for name in flags:
            check_bool(name, getattr(self, name))
        check_norm_eps(self.norm_eps)
        check_activation(self.activation)
        check_kernel(self.kernel)
        check_widths(self.d_model, self.n_heads, self.position)

    def to_dict(self) -> dict:
        return asdict(self)


class LanguageModel(ModelBasics, nn.Module):
    """Token embeddings (times sqrt(d_model), unless the config says not
    to) plus positions, N blocks
    under the causal mask, a final LayerNorm (pre-LN) and the output
    projection to next-token logits.

    Shape:
        tokens: (B, L) token ids; output: (B, L, V), row t the scores of
        the token after tokens[:, t].
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.check_ids = False  # True: check ids on a GPU, in graphs too
        self.embed = nn.Embedding(c.vocab, c.d_model)
        # unit-variance embeddings once multiplied by sqrt(d_model)
        nn.init.normal_(self.embed.weight, std=1 / math.sqrt(c.d_model))
        self.positional = absolute_positions(c)  # nothing if relative
        self.layers = nn.ModuleList(
            EncoderLayer(
                c.d_model,
                c.n_heads,
                c.d_ff,
                c.dropout,
                c.norm_first,
                position=position,  # relative, in self-attention
                activation=c.activation,
                inner_dropout=c.inner_dropout,
                norm_eps=c.norm_eps,
            )
            for position in relative_positions(c, causal=True)
        )
        self.norm = (
            nn.LayerNorm(c.d_model, eps=c.norm_eps)
            if c.norm_first
            else nn.Identity()
        )
        self.generator = nn.Linear(c.d_model, c.vocab, bias=c.output_bias)
        if c.tie_embeddings:
            self.generator.weight = self.embed.weight
        set_attention_kernel(self, c.kernel)

    def forward(
        self,
        tokens: Tensor,
        *,
        cache: StackCache | None = None,
        memory: SegmentMemory | None = None,
    ) -> Tensor:
        """Next-token logits for every position of ``tokens``.

        Args:
            tokens: token ids. Padding, if any, must come at the end of
                a row: under the causal mask no real token attends to it.
            cache: from :meth:`new_cache`; ``tokens`` are the positions
                after those cached, and the cache grows by them.
            memory: Transformer-XL's memory (:class:`SegmentMemory`):
                each block also attends to the previous segment's hidden
                states, and the memory then holds this segment's.

        Shape:
            tokens: (B, L); output: (B, L, V).
        """
        check_token_tensor(tokens, "tokens")
        check_ids_here(tokens, self.config.vocab, "tokens", self.check_ids)
        if cache is not None and memory is not None:
            raise ValueError("pass a cache or a segment memory, not both")
        if memory is not None and scheme(self.config.position).table:
            others = ", ".join(p for p in POSITIONS if not scheme(p).table)
            raise ValueError(
                "a segment memory needs relative positions (or none): its "
                "tokens were seen at other offsets than the segment's; "
                f"build the model with position in {others}, not "
                f"{self.config.position!r}"
            )
        offset = 0 if cache is None else cache.length
        x = self.embed(tokens)  # (B, L, C)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        if memory is not None:
            if not isinstance(memory, SegmentMemory):
                raise ValueError(
                    "memory must be a SegmentMemory (model.new_memory), "
                    f"got {type(memory).__name__}"
                )
            memory.check_fits(n_layers=self.config.n_layers,
                              batch=x.size(0), d_model=x.size(-1),
                              dtype=x.dtype, device=x.device)  # fmt: skip
        x = self.positional(x, offset)
        inputs = []  # each block's input: the next segment's memory
        for i, layer in enumerate(self.layers):
            inputs.append(x)
            x = layer(
                x,
                segment=None if memory is None else memory.layer(i),
                cache=None if cache is None else cache.layers[i],
                is_causal=True,
            )  # (B, L, C)
        if cache is not None:
            cache.length += tokens.size(1)
        if memory is not None:
            memory.update(inputs)
        return self.generator(self.norm(x))  # (B, L, V)

    def new_cache(self) -> StackCache:
        """An empty key/value cache for generation (chapters 8 and 10):
        one self-attention cache per block."""
        return StackCache.empty(self.config.n_layers)

    def new_memory(self, mem_len: int) -> SegmentMemory:
        """An empty Transformer-XL memory of ``mem_len`` positions."""
        return SegmentMemory(mem_len, self.config.n_layers)


def make_lm(vocab: int, **config_fields) -> LanguageModel:
    """Build a :class:`LanguageModel`; keyword arguments are
    :class:`LMConfig` fields."""
    return LanguageModel(LMConfig(vocab, **config_fields))
