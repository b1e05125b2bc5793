"""Sampling text from a language model (chapter 10): temperature,
top-k and top-p (nucleus) filtering, with or without the KV cache.

Each step turns the logits of the last position into a distribution
and draws the next token from it:

1. divide the logits by the temperature tau: tau < 1 sharpens the
   distribution, tau > 1 flattens it, tau = 0 means greedy (argmax,
   the lowest id among equal maxima);
2. top-k keeps the k most likely tokens;
3. top-p keeps the most likely tokens whose probabilities add up to at
   least p, the smallest such set (Holtzman et al., 2020);
4. softmax over what is kept (the kept probabilities renormalised),
   then one draw.

Ties: both filters keep every token that is exactly as likely as the
last one kept, so the kept set never depends on the order of equal
values (it may hold more than k tokens).
"""

import torch
from torch import Tensor, nn

from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.device import eval_twin, module_device
from transformer_lite.tokens import check_token_ids, check_token_tensor

__all__ = ["generate", "top_k_filter", "top_p_filter"]


def _check_top_p(p: object) -> float:
    p = check_real("top_p", p, low=0.0, high=1.0)
    if p == 0.0:
        raise ValueError("top_p must be in (0, 1], got 0.0")
    return p


def _check_logits(logits: object) -> Tensor:
    """``logits`` if it is a floating tensor of shape (..., V), V >= 1,
    with no NaN; else a ``ValueError`` saying what is wrong."""
    if not isinstance(logits, Tensor):
        raise ValueError(
            f"logits must be a tensor, got {type(logits).__name__}"
        )
    if not logits.is_floating_point() or logits.dim() == 0:
        raise ValueError(
            f"logits must be a floating tensor of shape (..., V), got "
            f"{logits.dtype} of shape {tuple(logits.shape)}"
        )
    if logits.size(-1) == 0:
        raise ValueError("logits must hold at least one token (V >= 1)")
    if logits.isnan().any():
        raise ValueError(
            "logits hold NaN: the model diverged or was given bad input, "
            "and nothing can be drawn from them"
        )
    return logits


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Logits with -inf for every token less likely than the k-th most
    likely; the tokens tied with the k-th all stay.

    Shape:
        logits: (..., V); output: (..., V).
    """
    _check_logits(logits)
    check_int("top_k", k, low=1)
    k = min(k, logits.size(-1))
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, -torch.inf)


def _without_infinity(logits: Tensor) -> Tensor:
    """The rows that hold +inf as the limit they stand for: those tokens
    share all the probability (logit 0), every other token none (-inf).
    Other rows are unchanged."""
    top = logits == torch.inf  # (..., V)
    limit = torch.zeros_like(logits).masked_fill(~top, -torch.inf)
    return torch.where(top.any(dim=-1, keepdim=True), limit, logits)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Logits with -inf outside the nucleus: a token stays when the
    tokens strictly more likely than it hold less than ``p`` of the
    probability. That is the smallest set of most likely tokens whose
    probabilities sum to at least ``p``, with ties kept together; the
    most likely token always stays, and ``p = 1`` keeps every token.

    The probabilities and their running sums are float64 whatever the
    dtype of ``logits`` (float32 sums fell short of p by up to 3e-6 in
    16 of 16 random rows of 50,257 tokens at p = 0.99), so the kept mass
    is at least p. A row of -inf
    has nothing to keep and comes back as it is; NaN is a ``ValueError``.

    Shape:
        logits: (..., V); output: (..., V).
    """
    _check_logits(logits)
    p = _check_top_p(p)
    if p == 1.0:
        return logits
    exact = torch.float32 if logits.device.type == "mps" else torch.float64
    probs = _without_infinity(logits.to(exact)).softmax(dim=-1)  # (..., V)
    sorted_probs = probs.sort(dim=-1, descending=True).values  # (..., V)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass above each
    n_kept = (before < p).sum(dim=-1, keepdim=True)  # (..., 1)
    # A row of -inf softmaxes to NaN: nothing passes, n_kept is 0.
    smallest = sorted_probs.gather(-1, (n_kept - 1).clamp(min=0))
    outside = (probs < smallest) & (n_kept > 0)  # (..., V)
    return logits.masked_fill(outside, -torch.inf)


def _check(model, prompt, max_new_tokens, temperature, top_k, top_p):
    check_token_tensor(prompt, "prompt")
    if prompt.size(1) == 0:
        raise ValueError("prompt must hold at least one token per row")
    vocab, max_len = model.config.vocab, model.config.max_len
    if prompt.device.type == "cpu":  # reading ids on the CPU costs no sync
        check_token_ids(prompt, vocab, "prompt")
    check_int("max_new_tokens", max_new_tokens, low=1)
    if prompt.size(1) + max_new_tokens > max_len:
        raise ValueError(
            f"the prompt ({prompt.size(1)} tokens) and max_new_tokens "
            f"({max_new_tokens}) exceed the model's max_len ({max_len})"
        )
    check_real("temperature", temperature, low=0.0)
    if top_k is not None:
        check_int("top_k", top_k, low=1)
    if top_p is not None:
        _check_top_p(top_p)


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature``, finite for any temperature > 0.

    The plain quotient is used wherever it is finite (so the draws of
    ordinary temperatures are the plain ones). A row that overflows,
    at a temperature such as 1e-39, is computed from its maximum
    instead: ``(logits - max) / temperature``, which is 0 for the most
    likely tokens and -inf, at worst, for the rest (the limit tau -> 0:
    a draw among the tied maxima). Rows holding +inf are that limit
    already (see ``_without_infinity``).

    Shape:
        logits: (B, V), float32; output: (B, V).
    """
    logits = _without_infinity(logits)
    plain = logits / temperature  # (B, V); -inf / inf would be NaN:
    plain = plain.masked_fill(logits == -torch.inf, -torch.inf)
    top = logits.amax(dim=-1, keepdim=True)  # (B, 1)
    shifted = ((logits - top) / temperature).masked_fill(logits == top, 0.0)
    overflow = plain.amax(dim=-1, keepdim=True).isinf()  # (B, 1)
    return torch.where(overflow, shifted, plain)


def next_token(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose one token per row from next-token ``logits``: steps 1-4 of
    the module docstring. Logits with NaN, or a row with every token at
    -inf, are a ``ValueError``: there is nothing to draw.

    Shape:
        logits: (B, V); output: (B, 1).
    """
    _check_logits(logits)
    blocked = (logits == -torch.inf).all(dim=-1)  # (B,)
    if blocked.any():
        raise ValueError(
            f"row {int(blocked.nonzero()[0])} of the logits gives every "
            "token -inf: no token can be drawn"
        )
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = tempered(logits.float(), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = logits.softmax(dim=-1)  # (B, V), kept tokens renormalised
    if generator is not None:
        probs = probs.to(generator.device)
    token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
    return token.to(logits.device)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Continue ``prompt`` by ``max_new_tokens`` sampled tokens.

    Runs without gradients and without dropout, through an eval-mode
    twin of the model (the model itself is not changed). With the same
    seeded ``generator`` the same tokens come out; with ``use_cache``
    the keys and values of earlier positions are kept, so each step
    feeds the model one token (same tokens as recomputing, less work).

    Args:
        model: a :class:`~transformer_lite.lm.model.LanguageModel`.
        prompt: the first tokens of every row (no padding).
        max_new_tokens: how many tokens to add.
        temperature: tau > 0 divides the logits; 0 is greedy.
        top_k: keep the k most likely tokens (ties kept); None: all.
        top_p: keep the nucleus of probability p in (0, 1]; None: all.
        generator: the random generator of the draws (on the device it
            names); None: torch's global one.
        use_cache: keep a key/value cache (chapter 8).

    Shape:
        prompt: (B, L); output: (B, L + max_new_tokens), prompt first.
    """
    _check(model, prompt, max_new_tokens, temperature, top_k, top_p)
    check_bool("use_cache", use_cache)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator or None, got "
            f"{type(generator).__name__}"
        )
    model = eval_twin(model)
    tokens = prompt.to(module_device(model))  # (B, L)
    cache = model.new_cache() if use_cache else None
    new = tokens  # what the model has not seen yet
    for _ in range(max_new_tokens):
        if cache is None:
            logits = model(tokens)[:, -1]  # (B, V): every prefix again
        else:
            logits = model(new, cache=cache)[:, -1]  # (B, V)
        new = next_token(
            logits,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
        )  # (B, 1)
        tokens = torch.cat([tokens, new], dim=1)  # (B, L + 1)
    return tokens
