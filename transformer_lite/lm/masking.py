"""BERT's training batches: hide some tokens and ask for them back
(chapter 13; Devlin et al., 2019).

A fraction ``p`` of the eligible positions of each row is chosen (never
padding, never a special id). Of the chosen, a share ``mask_rate``
shows the mask id, a share ``random_rate`` a random token, and the rest
their own token; the model must predict the original token at every
chosen position, and nothing elsewhere. The random and kept tokens are
what make the model's output at a visible token worth reading: if every
chosen token were masked (``mask_rate=1``), it would only ever be asked
about [MASK] positions, and fine-tuning, whose texts hold no [MASK],
would read outputs that no loss ever trained.
"""

from collections.abc import Iterable

import torch
from torch import Tensor

from transformer_lite.checks import check_int, check_real
from transformer_lite.tokens import PAD_ID, check_token_ids

__all__ = ["IGNORE_INDEX", "mask_tokens"]

# The target of a position the loss skips: torch's cross-entropy default.
IGNORE_INDEX = -100

# Rounding slack when mask_rate + random_rate is compared with 1.
RATE_SLACK = 1e-12


def _check_rates(p: object, mask_rate: object, random_rate: object) -> None:
    p = check_real("p", p, low=0.0, high=1.0)
    if p == 0.0:
        raise ValueError(
            "p must be in (0, 1]: with p=0 no position is chosen and the "
            "batch holds no target to learn from"
        )
    mask_rate = check_real("mask_rate", mask_rate, low=0.0, high=1.0)
    random_rate = check_real("random_rate", random_rate, low=0.0, high=1.0)
    if mask_rate + random_rate > 1.0 + RATE_SLACK:
        raise ValueError(
            "mask_rate + random_rate must be at most 1 (the rest of the "
            f"chosen tokens stay as they are), got {mask_rate} + "
            f"{random_rate} = {mask_rate + random_rate}"
        )


def _special_set(
    special_ids: Iterable[int], mask_id: int, pad_id: int, vocab: int
) -> list[int]:
    """The ids never chosen and never drawn: ``special_ids``, the mask
    id and the pad id, each checked inside the vocabulary."""
    if isinstance(special_ids, (str, bytes)) or not isinstance(
        special_ids, Iterable
    ):
        raise ValueError(
            "special_ids must be a collection of token ids, got "
            f"{special_ids!r}"
        )
    special = set()
    for name, value in [("mask_id", mask_id), ("pad_id", pad_id)] + [
        ("special_ids", i) for i in special_ids
    ]:
        check_int(name, value)
        if not 0 <= value < vocab:
            raise ValueError(
                f"{name} holds id {value}, outside the vocabulary "
                f"[0, {vocab - 1}] (vocab={vocab})"
            )
        special.add(value)
    if len(special) == vocab:
        raise ValueError(
            f"every id of the vocabulary (vocab={vocab}) is special: no "
            "token is left to choose or to draw"
        )
    return sorted(special)


def mask_tokens(
    tokens: Tensor,
    *,
    vocab: int,
    mask_id: int,
    generator: torch.Generator,
    special_ids: Iterable[int] = (),
    pad_id: int = PAD_ID,
    p: float = 0.15,
    mask_rate: float = 0.8,
    random_rate: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """The inputs and targets of one masked-LM batch.

    Each row with n eligible positions (neither ``pad_id``, ``mask_id``
    nor one of ``special_ids``) has exactly k = max(1, floor(p n + 1/2))
    of them chosen, uniformly at random. A fixed count per row, as in
    Google's BERT data pipeline (``create_pretraining_data.py``, which
    counts [CLS] and [SEP] in n and caps k), rather than a coin per
    position (Hugging Face's collator): every row with a real token
    teaches something, so no batch has a loss over zero tokens, and a
    batch's target count does not vary by chance. Each chosen position
    then independently becomes ``mask_id`` with probability
    ``mask_rate``, a random token with probability ``random_rate``, and
    stays itself otherwise.

    The random token is drawn uniformly from the ids that are not
    special, so a batch never shows a stray [CLS], [SEP], [MASK] or pad
    in the middle of a text; BERT draws from the whole vocabulary. It
    may happen to be the original token, as in BERT.

    Args:
        tokens: token ids, padded with ``pad_id``; checked to lie in
            [0, ``vocab``).
        vocab: V, the size of the vocabulary.
        mask_id: the [MASK] id.
        generator: every random draw comes from it (on its device): a
            seeded generator gives the same batch.
        special_ids: further ids never chosen nor drawn ([CLS], [SEP],
            BOS, EOS, ...).
        pad_id: padding, never chosen.
        p: the share of eligible positions chosen, in (0, 1].
        mask_rate, random_rate: the shares of the chosen shown as the
            mask and as a random token; the rest, 1 - mask_rate -
            random_rate, keep their token.

    Returns:
        ``(inputs, targets)``: ``inputs`` of ``tokens``' dtype and
        device; ``targets`` (torch.long) hold the original token at each
        chosen position and :data:`IGNORE_INDEX` (-100, what
        ``nn.CrossEntropyLoss`` skips by default) elsewhere. Use them as
        ``Examples(inputs, targets, ignore_index=IGNORE_INDEX)``.

    Raises:
        ValueError: bad arguments, or no row with an eligible position
            (nothing to predict).

    Shape:
        tokens: (B, L); inputs, targets: (B, L).
    """
    if not isinstance(generator, torch.Generator):
        raise ValueError(
            "generator must be a torch.Generator (seeded, e.g. "
            "torch.Generator().manual_seed(0)), got "
            f"{type(generator).__name__}"
        )
    check_int("vocab", vocab, low=1)
    check_token_ids(tokens, vocab, "tokens")  # reads values: a sync on GPU
    _check_rates(p, mask_rate, random_rate)
    special = _special_set(special_ids, mask_id, pad_id, vocab)
    g = generator
    B, L = tokens.shape
    specials = torch.tensor(special, device=tokens.device)  # (S,)
    eligible = ~torch.isin(tokens, specials)  # (B, L)
    n = eligible.sum(dim=1)  # (B,)
    if not bool(n.any()):
        raise ValueError(
            "no position of tokens can be chosen: every one is padding or "
            "a special id, so the batch would hold nothing to predict"
        )
    k = torch.clamp(torch.floor(p * n + 0.5).long(), min=1)  # (B,)
    k = torch.minimum(k, n)  # rows with nothing eligible choose nothing
    # A uniform random subset of k eligible places: rank random scores,
    # the ineligible placed last.
    scores = torch.rand(B, L, generator=g, device=g.device).to(tokens.device)
    scores = scores.masked_fill(~eligible, 2.0)  # above every draw
    ranks = scores.argsort(dim=1).argsort(dim=1)  # (B, L)
    chosen = ranks < k[:, None]  # (B, L)
    # What each chosen place shows: the mask, a random token, or itself.
    u = torch.rand(B, L, generator=g, device=g.device).to(tokens.device)
    masked = chosen & (u < mask_rate)
    randomised = chosen & ~masked & (u < mask_rate + random_rate)
    allowed = torch.ones(vocab, dtype=torch.bool, device=tokens.device)
    ordinary = allowed.index_fill(0, specials, False).nonzero()[:, 0]
    # ordinary: (V - S,), the ids a random token is drawn from
    draw = torch.randint(len(ordinary), (B, L), generator=g, device=g.device)
    random_ids = ordinary[draw.to(tokens.device)].to(tokens.dtype)  # (B, L)
    inputs = tokens.masked_fill(masked, mask_id)
    inputs = torch.where(randomised, random_ids, inputs)
    targets = tokens.long().masked_fill(~chosen, IGNORE_INDEX)
    return inputs, targets
