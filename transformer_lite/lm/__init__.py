"""Language-model tier (chapter 10): a decoder-only model built from the
core's layers under the causal mask, sampling (temperature, top-k,
top-p), Transformer-XL's segment memory and perplexity.

Built on the core only; nothing in the core imports this package.
"""

from transformer_lite.lm.generate import generate, top_k_filter, top_p_filter
from transformer_lite.lm.memory import SegmentMemory
from transformer_lite.lm.model import LanguageModel, LMConfig, make_lm
from transformer_lite.lm.perplexity import (
    next_token_loss,
    perplexity,
    segments,
    token_losses,
)

__all__ = [
    "LMConfig",
    "LanguageModel",
    "SegmentMemory",
    "generate",
    "make_lm",
    "next_token_loss",
    "perplexity",
    "segments",
    "token_losses",
    "top_k_filter",
    "top_p_filter",
]
