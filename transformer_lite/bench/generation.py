"""Sampling from the decoder-only language model (chapter 10), with and
without the KV cache, side by side: one of the benchmark's measurements
(:mod:`transformer_lite.bench.report`).

Without the cache, token t costs a forward pass over all t tokens
before it; with it, a pass over one. Both are greedy here (temperature
0), so they must give the same tokens, and the row says whether they
did.
"""

from functools import partial

import torch

from transformer_lite.bench.cases import DECODING_REPEATS, _summary, alternate
from transformer_lite.bench.fixtures import Sizes
from transformer_lite.device import seed_everything
from transformer_lite.lm.generate import generate
from transformer_lite.lm.model import LanguageModel, make_lm

__all__ = ["PROMPT_LEN", "bench_generation", "our_lm"]

PROMPT_LEN = 16  # tokens of prompt per row before the new ones


def our_lm(s: Sizes, new_tokens: int) -> LanguageModel:
    """A decoder-only model as wide and deep as the benchmark's
    Transformer (its decoder without cross-attention), fused attention,
    RoPE, long enough for the prompt and ``new_tokens``."""
    return make_lm(
        s.vocab, max_len=PROMPT_LEN + new_tokens, **s.model_fields()
    )


def bench_generation(s: Sizes, device: torch.device, repeats: int) -> dict:
    """``decode_batch`` rows of :data:`PROMPT_LEN` random tokens, each
    continued by the largest of ``decode_tokens`` new tokens, every
    prefix recomputed (``use_cache=False``) against the cache.

    At most ``DECODING_REPEATS`` rounds, as greedy decoding: recomputing
    is slow.
    """
    new_tokens = max(s.decode_tokens)
    seed_everything(3)
    model = our_lm(s, new_tokens).to(device).eval()
    prompt = torch.randint(4, s.vocab, (s.decode_batch, PROMPT_LEN))
    prompt = prompt.to(device)  # (B, L)
    generate(model, prompt, 2, temperature=0)  # warm up
    run = partial(generate, model, prompt, new_tokens, temperature=0)
    contenders = {
        "recompute": partial(run, use_cache=False),
        "cached": partial(run, use_cache=True),
    }
    outputs = {}
    label = f"generating {new_tokens} tokens"
    repeats = min(repeats, DECODING_REPEATS)
    times = alternate(contenders, repeats, device, label, outputs)
    row = {"new_tokens": new_tokens, "batch": s.decode_batch}
    row["prompt"] = PROMPT_LEN
    for name, t in times.items():
        row[name] = _summary(t)
    row["speedup"] = row["recompute"]["median_s"] / row["cached"]["median_s"]
    row["same_tokens"] = torch.equal(outputs["recompute"], outputs["cached"])
    return row
