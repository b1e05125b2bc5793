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


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Logits with -inf for every token less likely than the k-th most
    likely; the tokens tied with the k-th all stay.

    Shape:
        logits: (..., V); output: (..., V).
    """
    check_int("top_k", k, low=1)
    k = min(k, logits.size(-1))
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, -torch.inf)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Logits with -inf outside the nucleus: a token stays when the
    tokens strictly more likely than it hold less than ``p`` of the
    probability. That is the smallest set of most likely tokens whose
    probabilities sum to at least ``p``, with ties kept together; the
    most likely token always stays.

    Shape:
        logits: (..., V); output: (..., V).
    """
    p = _check_top_p(p)
    probs = logits.float().softmax(dim=-1)  # (..., V)
    sorted_probs = probs.sort(dim=-1, descending=True).values  # (..., V)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass above each
    n_kept = (before < p).sum(dim=-1, keepdim=True)  # (..., 1), >= 1
    smallest = sorted_probs.gather(-1, n_kept - 1)  # (..., 1)
    return logits.masked_fill(probs < smallest, -torch.inf)


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


def next_token(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose one token per row from next-token ``logits``: steps 1-4 of
    the module docstring.

    Shape:
        logits: (B, V); output: (B, 1).
    """
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = logits.float() / temperature
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
