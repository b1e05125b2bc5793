"""transformer-lite: a small, exact, tested Transformer.

The companion package of the transformer-lite book. Each module holds one
concept and names the chapter that teaches it.

Shape legend, used in every docstring and ``# (...)`` comment:

====  =============================================
B     batch size
S     source length
T     target length
L     any sequence length (Lq queries, Lk keys)
C     model width, ``d_model``
H     number of attention heads
D     head size, ``d_k = d_model / H``
V     vocabulary size
====  =============================================

Mask convention, everywhere: a boolean tensor, **True = may attend**.
"""

from transformer_lite.attention import (
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from transformer_lite.device import default_device, seed_everything
from transformer_lite.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
)
from transformer_lite.masks import causal_mask, padding_mask, target_mask
from transformer_lite.model import Transformer, TransformerConfig, make_model
from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "default_device",
    "make_model",
    "padding_mask",
    "scaled_dot_product_attention",
    "seed_everything",
    "sinusoidal_table",
    "target_mask",
]
