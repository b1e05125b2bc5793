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

The modules at the top of the package are the core, the Transformer that
the book explains. Above it, each in a subpackage and each importing only
from those below it: :mod:`transformer_lite.training` (chapters 6-8),
:mod:`transformer_lite.lm` (chapter 10), :mod:`transformer_lite.tasks`
(chapters 6, 7 and 10) and :mod:`transformer_lite.bench` (chapter 8).
"""

from transformer_lite.attention import (
    MultiHeadAttention,
    attend,
    scaled_dot_product_attention,
    set_attention_kernel,
)
from transformer_lite.chunked import chunked_attention
from transformer_lite.device import (
    default_device,
    evaluating,
    module_device,
    seed_everything,
)
from transformer_lite.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
)
from transformer_lite.masks import causal_mask, padding_mask, target_mask
from transformer_lite.model import (
    Transformer,
    TransformerConfig,
    make_model,
)
from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    RelativePosition,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from transformer_lite.relative import (
    ALiBiBias,
    ShawRelativeKeys,
    T5RelativeBias,
)
from transformer_lite.rotary import RotaryEmbedding
from transformer_lite.schemes import POSITIONS, SCHEMES
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID

__version__ = "0.1.0"

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "POSITIONS",
    "SCHEMES",
    "ALiBiBias",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "NoPositionalEncoding",
    "RelativePosition",
    "RotaryEmbedding",
    "ShawRelativeKeys",
    "SinusoidalPositionalEncoding",
    "T5RelativeBias",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "attend",
    "chunked_attention",
    "default_device",
    "evaluating",
    "make_model",
    "module_device",
    "padding_mask",
    "scaled_dot_product_attention",
    "seed_everything",
    "set_attention_kernel",
    "sinusoidal_table",
    "target_mask",
]
