"""Language-model tier (chapters 10 and 13): a decoder-only model built
from the core's layers under the causal mask, sampling (temperature,
top-k, top-p), Transformer-XL's segment memory and perplexity; an
encoder-only model in BERT's shape (masked-LM head, pooler, a
classifier for fine-tuning) and its masked-LM batches.

Built on the core only; nothing in the core imports this package.
"""

from transformer_lite.lm.generate import generate, top_k_filter, top_p_filter
from transformer_lite.lm.masked import (
    EncoderClassifier,
    EncoderConfig,
    EncoderModel,
    make_encoder,
)
from transformer_lite.lm.masking import IGNORE_INDEX, mask_tokens
from transformer_lite.lm.memory import SegmentMemory
from transformer_lite.lm.model import LanguageModel, LMConfig, make_lm
from transformer_lite.lm.perplexity import (
    next_token_loss,
    perplexity,
    segments,
    token_losses,
)

__all__ = [
    "IGNORE_INDEX",
    "EncoderClassifier",
    "EncoderConfig",
    "EncoderModel",
    "LMConfig",
    "LanguageModel",
    "SegmentMemory",
    "generate",
    "make_encoder",
    "make_lm",
    "mask_tokens",
    "next_token_loss",
    "perplexity",
    "segments",
    "token_losses",
    "top_k_filter",
    "top_p_filter",
]
