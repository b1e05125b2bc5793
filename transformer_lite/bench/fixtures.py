"""What the benchmark compares (chapter 8): its sizes, our model, and
``torch.nn.Transformer`` dressed as our model, with exactly as many
parameters, so that a training step of each does the same work.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer_lite.layers import glorot_init
from transformer_lite.masks import causal_mask, to_torch_attn_mask
from transformer_lite.model import Transformer, make_model
from transformer_lite.positional import SinusoidalPositionalEncoding
from transformer_lite.tokens import PAD_ID

__all__ = [
    "GPU",
    "QUICK",
    "Sizes",
    "TorchReference",
    "our_model",
    "random_batch",
]


@dataclass
class Sizes:
    """Every size the benchmark uses; the defaults are the issue's."""

    vocab: int = 1000  # V, one vocabulary for source and target
    d_model: int = 256  # C
    n_layers: int = 2  # in the encoder and in the decoder
    d_ff: int = 1024  # feed-forward inner width
    n_heads: int = 4  # H
    dropout: float = 0.1  # on in training, identical for both models
    batch: int = 32  # B of a training step
    length: int = 64  # S = T of a training step
    decode_batch: int = 8  # sequences decoded at once
    decode_tokens: tuple[int, ...] = (64, 256)  # new tokens per sequence
    attention_lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    attention_heads: int = 1  # H of the attention-only measurement
    head_size: int = 64  # D of the attention-only measurement
    chunk_size: int = 512  # keys per chunk of chunked attention
    query_chunk_size: int = 1024  # queries per block of chunked attention
    matmul_size: int = 2048  # n of the n x n products that measure the peak

    def model_fields(self) -> dict:
        """The sizes every benchmarked model shares: layers, widths,
        heads and dropout (a model config's keyword arguments)."""
        names = ("n_layers", "d_model", "d_ff", "n_heads", "dropout")
        return {name: getattr(self, name) for name in names}


QUICK = Sizes(  # tiny, for the smoke test: seconds, not minutes
    vocab=50,
    d_model=32,
    n_layers=1,
    d_ff=64,
    n_heads=2,
    batch=4,
    length=8,
    decode_batch=2,
    decode_tokens=(4, 8),
    attention_lengths=(64, 128),
    head_size=16,
    chunk_size=32,
    query_chunk_size=48,
    matmul_size=512,
)

GPU = Sizes(  # chosen on CUDA: large enough that the kernels, not their
    vocab=8192,  # launches, take the time
    d_model=1024,
    n_layers=4,
    d_ff=4096,
    n_heads=16,
    batch=32,
    length=256,
    decode_batch=64,
    decode_tokens=(64, 256),
    attention_lengths=(1024, 2048, 4096, 8192, 16384),
    attention_heads=4,
    head_size=64,
    chunk_size=1024,
    query_chunk_size=2048,
    matmul_size=8192,
)


def our_model(s: Sizes) -> Transformer:
    """Our post-LN Transformer (the paper's layout) at sizes ``s``."""
    return make_model(s.vocab, s.vocab, pad_id=PAD_ID, **s.model_fields())


class TorchReference(nn.Module):
    """``nn.Transformer`` with what our model has around its two stacks:
    embeddings scaled by sqrt(C), sinusoidal positions, and the output
    projection, initialised as ours (Glorot matrices, zero biases).

    ``nn.Transformer`` normally ends its encoder and its decoder with a
    LayerNorm; our post-LN stacks have none. It is therefore given stacks
    built without that final norm (``norm=None``): then the two models
    have the same layers and exactly the same number of parameters.

    Shape:
        src: (B, S) token ids; tgt: (B, T) token ids; output: (B, T, V).
    """

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.d_model = s.d_model
        self.src_embed = nn.Embedding(s.vocab, s.d_model)
        self.tgt_embed = nn.Embedding(s.vocab, s.d_model)
        self.positional = SinusoidalPositionalEncoding(s.d_model, s.dropout)
        layer = dict(
            d_model=s.d_model,
            nhead=s.n_heads,
            dim_feedforward=s.d_ff,
            dropout=s.dropout,
            batch_first=True,
        )
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer),
            s.n_layers,
            norm=None,
            enable_nested_tensor=False,
        )
        decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer), s.n_layers, norm=None
        )
        self.transformer = nn.Transformer(
            custom_encoder=encoder, custom_decoder=decoder, **layer
        )
        self.generator = nn.Linear(s.d_model, s.vocab)
        glorot_init(self)

    def embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.d_model)  # (B, L, C)
        return self.positional(x)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Our model's signature; the masks are built from padding here
        (as ours builds them), so the ones passed in are not used."""
        # nn.Transformer's masks say True = masked out: the opposite of ours.
        src_pad = src == PAD_ID  # (B, S)
        tgt_pad = tgt == PAD_ID  # (B, T)
        future = to_torch_attn_mask(causal_mask(tgt.size(1), tgt.device))
        hidden = self.transformer(
            self.embed(src, self.src_embed),
            self.embed(tgt, self.tgt_embed),
            tgt_mask=future[0],  # (T, T)
            tgt_is_causal=True,  # else torch reads the mask to find out
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )  # (B, T, C)
        return self.generator(hidden)  # (B, T, V)


def random_batch(
    s: Sizes, batch: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Random source and target ids, each row padded after a random
    length between half and all of ``s.length``; seeded by the caller.

    Shape:
        output: src (B, S) and tgt (B, T + 1), the target shifted by one
        giving the decoder's input ``tgt[:, :-1]`` and labels
        ``tgt[:, 1:]``.
    """
    tensors = []
    for length in (s.length, s.length + 1):
        ids = torch.randint(1, s.vocab, (batch, length))  # (B, L)
        kept = torch.randint(length // 2, length + 1, (batch, 1))  # (B, 1)
        ids = ids.masked_fill(torch.arange(length) >= kept, PAD_ID)
        tensors.append(ids.to(device))
    src, tgt = tensors
    return src, tgt
