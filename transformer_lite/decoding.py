"""Decoding: from a trained model's next-token scores to whole sequences
(greedy search in chapter 6, beam search in chapter 7, the KV cache,
``use_cache=True``, in chapter 8).
"""

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from transformer_lite.cache import DecoderCache
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.device import eval_twin, module_device
from transformer_lite.masks import padding_mask

__all__ = [
    "beam_search",
    "exact_match",
    "gnmt_length_penalty",
    "greedy_decode",
    "Seq2Seq",
]


def _check_id(value: object, name: str, vocab: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int token id, got {value!r}")
    if not 0 <= value < vocab:
        raise ValueError(
            f"{name} must be a token id in [0, {vocab}), got {value!r}"
        )


def _check_inputs(
    model: nn.Module,
    max_len: int,
    bos_id: int,
    eos_id: int | None,
) -> None:
    longest = model.config.max_len
    if (
        isinstance(max_len, bool)
        or not isinstance(max_len, int)
        or not 1 <= max_len <= longest
    ):
        raise ValueError(
            f"max_len must be an int in [1, {longest}] (the model's "
            f"max_len), got {max_len!r}"
        )
    _check_id(bos_id, "bos_id", model.config.tgt_vocab)
    if eos_id is not None:
        _check_id(eos_id, "eos_id", model.config.tgt_vocab)


class Seq2Seq(Protocol):
    """What decoding asks of a model: the :class:`~transformer_lite.model.
    Transformer`, chapter 11's image reader and the exported graphs of
    chapter 12 each answer it, and decoding touches nothing else.

    ``config`` holds ``tgt_vocab``, ``pad_id`` and ``max_len``.
    """

    config: Any

    def source_mask(self, src: Any) -> Tensor:
        """The mask over the memory (B, 1, S) the model makes of ``src``
        (checked): True where the decoder may attend."""

    def encode(self, src: Any, src_mask: Tensor | None = None) -> Tensor:
        """``src`` -> memory (B, S, C)."""

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Target ids (B, T) over the memory -> hidden states (B, T, C);
        with a ``cache``, ``tgt`` holds only the new positions."""

    def logits(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., C) -> next-token scores (..., V)."""

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for one source."""


def _source(
    model: nn.Module, src: Tensor, src_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``src`` and its mask (the model's own unless one is given, which
    must have the same shape), both on the model's device."""
    expected = model.source_mask(src)  # (B, 1, S)
    if src_mask is not None and (
        src_mask.dtype != torch.bool or src_mask.shape != expected.shape
    ):
        raise ValueError(
            f"src_mask must be a bool tensor of shape (B, 1, S) = "
            f"{tuple(expected.shape)}, got {src_mask.dtype} of shape "
            f"{tuple(src_mask.shape)}"
        )
    mask = expected if src_mask is None else src_mask
    device = module_device(model)
    return src.to(device), mask.to(device)


def _next_token_logits(
    model: nn.Module, memory: Tensor, src_mask: Tensor, ys: Tensor
) -> Tensor:
    """Scores for the token after ``ys``, decoding the whole prefix again:
    O(L^2) work per sequence. The KV cache (chapter 8) replaces this one
    step and must return the same scores.

    Shape:
        memory: (B, S, C); src_mask: (B, 1, S); ys: (B, L); output: (B, V).
    """
    hidden = model.decode(memory, src_mask, ys)  # (B, L, C)
    return model.logits(hidden[:, -1])  # (B, V)


def _cached_next_token_logits(
    model: nn.Module,
    memory: Tensor,
    src_mask: Tensor,
    ys: Tensor,
    cache: DecoderCache,
) -> Tensor:
    """The same scores as :func:`_next_token_logits`, decoding only the
    newest token of ``ys``: the keys and values of the earlier ones are in
    ``cache`` (chapter 8), so a step computes one position, not L.

    The newest token may attend to every earlier one except padding, which
    is the last row of the full decoder's ``target_mask``.

    Shape:
        memory: (B, S, C); src_mask: (B, 1, S); ys: (B, L); output: (B, V).
    """
    keys = padding_mask(ys, model.config.pad_id)  # (B, 1, L)
    hidden = model.decode(memory, src_mask, ys[:, -1:], keys, cache)
    return model.logits(hidden[:, -1])  # (B, V); hidden: (B, 1, C)


def greedy_decode(
    model: nn.Module,
    src: Tensor,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int | None = None,
    src_mask: Tensor | None = None,
    use_cache: bool = False,
) -> Tensor:
    """Decode by always taking the most probable next token (chapter 6).

    The source is encoded once; then every row grows by one token per
    step. A row that emits ``eos_id`` is finished: its later positions
    hold ``model.config.pad_id``, and decoding stops when every row has
    finished or the output is ``max_len`` tokens long. Rows do not
    influence each other: each equals the row decoded alone.

    Runs under ``torch.no_grad()`` without dropout, and never changes the
    model: a model in training mode is decoded through an eval-mode twin
    sharing its weights (:func:`~transformer_lite.device.eval_twin`), so
    several threads may decode with one model, or one may decode while
    another trains it.

    Args:
        model: a :class:`Seq2Seq`, such as the
            :class:`~transformer_lite.model.Transformer`.
        src: source token ids, or what the model's own ``source_mask``
            takes (images, chapter 11), moved to the model's device.
        src_mask: True at the memory positions to attend; None asks the
            model's ``source_mask`` (for a Transformer, the padding).
        max_len: the longest output, ``bos_id`` included.
        bos_id: the first token of every output.
        eos_id: the end token; None always decodes ``max_len`` tokens.
        use_cache: keep the keys and values of the tokens decoded so far
            (``model.new_cache()``) and feed the model only the newest
            token each step; same tokens, less work (chapter 8).

    Shape:
        src: (B, S); src_mask: (B, 1, S); output: (B, L), L <= max_len.
    """
    _check_inputs(model, max_len, bos_id, eos_id)
    check_bool("use_cache", use_cache)
    device = module_device(model)
    src, src_mask = _source(model, src, src_mask)  # mask: (B, 1, S)
    B = src.size(0)
    model = eval_twin(model)  # never model.eval(): model may be shared
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (B, S, C)
        ys = torch.full((B, 1), bos_id, device=device)  # (B, 1)
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        cache = model.new_cache() if use_cache else None
        for _ in range(max_len - 1):
            if cache is None:
                logits = _next_token_logits(model, memory, src_mask, ys)
            else:
                logits = _cached_next_token_logits(
                    model, memory, src_mask, ys, cache
                )
            next_token = logits.argmax(dim=-1)  # (B,)
            if eos_id is not None:
                pad_id = model.config.pad_id
                next_token = next_token.masked_fill(finished, pad_id)
                finished |= next_token == eos_id
            ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
            # bool() waits for the device: one sync per step.
            if eos_id is not None and bool(finished.all()):
                break
    return ys  # (B, L)


def exact_match(predicted: Tensor, expected: Tensor, pad_id: int) -> Tensor:
    """Whether each predicted row equals the expected one, after padding
    the shorter of the two with ``pad_id`` (compare what decoding returns
    with the full target, BOS and EOS included).

    Shape:
        predicted: (B, L1); expected: (B, L2); output: (B,), bool.
    """
    if predicted.dim() != 2 or expected.dim() != 2:
        raise ValueError(
            f"predicted and expected must be (B, L) tensors, got "
            f"{tuple(predicted.shape)} and {tuple(expected.shape)}"
        )
    if predicted.size(0) != expected.size(0):
        raise ValueError(
            f"batch sizes differ: {predicted.size(0)} and {expected.size(0)}"
        )
    width = max(predicted.size(1), expected.size(1))
    predicted = nn.functional.pad(
        predicted, (0, width - predicted.size(1)), value=pad_id
    )
    expected = nn.functional.pad(
        expected.to(predicted.device),
        (0, width - expected.size(1)),
        value=pad_id,
    )
    return (predicted == expected).all(dim=1)  # (B,)


def gnmt_length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT's length penalty ((5 + len(Y)) / 6) ** alpha (Wu et al., 2016).

    Beam search ranks a hypothesis Y by log P(Y | X) / lp(Y): without it
    (alpha = 0) every extra token lowers the score and short outputs win.
    """
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    model: nn.Module,
    src: Tensor,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    return_scores: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best partial outputs of every source, not
    only the most probable one (chapter 7).

    All B sources and their k = ``beam_size`` hypotheses decode at once,
    as B * k rows with a key/value cache (``model.new_cache()``) whose
    self-attention part is reordered (``select``) when hypotheses are
    kept or dropped. At each
    step every hypothesis is extended by every token; of the k * V
    candidates of a source the k with the highest score log P / lp stay
    (lp: :func:`gnmt_length_penalty`, len(Y) counting the tokens after
    ``bos_id``, EOS included). A hypothesis that has emitted ``eos_id``
    is finished: it stays a candidate, extended by padding at no cost.
    Decoding stops when every kept hypothesis has finished or the output
    is ``max_len`` tokens long; each source returns its best hypothesis.
    ``beam_size=1`` is greedy decoding. Like :func:`greedy_decode`, it
    runs without gradients or dropout and never changes the model.

    Args:
        model: a :class:`Seq2Seq` (its ``decode`` takes a ``cache``).
        src, src_mask, max_len, bos_id, eos_id: as :func:`greedy_decode`.
        beam_size: k, hypotheses kept per source.
        length_penalty: alpha, a finite number >= 0; 0 ranks by
            log-probability alone.
        return_scores: also return the best hypotheses' scores.

    Shape:
        src: (B, S); src_mask: (B, 1, S); output: (B, L), L <= max_len,
        padded with ``model.config.pad_id`` after EOS; scores: (B,).
    """
    _check_inputs(model, max_len, bos_id, eos_id)
    check_int("beam_size", beam_size, low=1)
    # inf would make every score -0 (or NaN): an arbitrary winner
    check_real("length_penalty", length_penalty, low=0.0)
    check_bool("return_scores", return_scores)
    src, src_mask = _source(model, src, src_mask)  # mask: (B, 1, S)
    model = eval_twin(model)  # never model.eval(): model may be shared
    with torch.no_grad():
        ys, scores = _beam_search(
            model,
            src,
            src_mask,
            max_len,
            bos_id,
            eos_id,
            beam_size,
            length_penalty,
        )
    return (ys, scores) if return_scores else ys


def _beam_search(model, src, src_mask, max_len, bos_id, eos_id, k, alpha):
    """The search itself; arguments as :func:`beam_search`."""
    B, device = src.size(0), src.device
    pad_id = model.config.pad_id
    memory = model.encode(src, src_mask)  # (B, S, C)
    memory = memory.repeat_interleave(k, dim=0)  # (B*k, S, C)
    src_mask = src_mask.repeat_interleave(k, dim=0)  # (B*k, 1, S)
    cache = model.new_cache()
    ys = torch.full((B * k, 1), bos_id, device=device)  # (B*k, 1)
    # Log-probabilities so far; at first only hypothesis 0 of each source
    # is alive, so that the k copies of BOS do not yield k equal beams.
    log_p = torch.full((B, k), -torch.inf, device=device)  # (B, k)
    log_p[:, 0] = 0.0
    log_p = log_p.view(B * k)  # (B*k,)
    length = torch.zeros(B * k, device=device)  # tokens after BOS
    finished = torch.zeros(B * k, dtype=torch.bool, device=device)
    offsets = torch.arange(B, device=device).unsqueeze(1) * k  # (B, 1)
    for _ in range(max_len - 1):
        keys = padding_mask(ys, pad_id)  # (B*k, 1, L), as greedy's cache
        hidden = model.decode(memory, src_mask, ys[:, -1:], keys, cache)
        logits = model.logits(hidden[:, -1])  # (B*k, V)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        step = logits.to(dtype).log_softmax(dim=-1)  # (B*k, V)
        V = step.size(-1)
        # A finished hypothesis has one continuation, padding, for free.
        step[finished] = -torch.inf
        step[finished, pad_id] = 0.0
        candidate = log_p.unsqueeze(1) + step  # (B*k, V)
        grown = length + (~finished).float()  # (B*k,)
        lp = gnmt_length_penalty(grown, alpha).unsqueeze(1)  # (B*k, 1)
        ranked = (candidate / lp).view(B, k * V)  # (B, k*V)
        best = ranked.topk(k, dim=-1).indices  # (B, k)
        rows = (offsets + best // V).view(B * k)  # (B*k,) rows kept
        token = (best % V).view(B * k)  # (B*k,)
        log_p = candidate[rows, token]
        length, finished = grown[rows], finished[rows]
        finished = finished | (token == eos_id)
        ys = torch.cat([ys[rows], token.unsqueeze(1)], dim=1)
        if k > 1:
            # Like cache.select(rows), but the cross-attention keys and
            # values stay: they are the same for the k rows of a source.
            for layer in cache.layers:
                layer.self_attn.select(rows)
        if bool(finished.all()):
            break
    score = (log_p / gnmt_length_penalty(length, alpha)).view(B, k)
    best_score, best = score.max(dim=-1)  # (B,)
    ys = ys.view(B, k, -1)[torch.arange(B, device=device), best]  # (B, L)
    # Columns that only finished hypotheses reached hold padding alone;
    # the first (BOS) stays, even when bos_id is the padding id.
    used = (ys[:, 1:] != pad_id).any(dim=0).nonzero()  # (n, 1)
    keep = 1 if used.numel() == 0 else int(used.max()) + 2
    return ys[:, :keep], best_score  # (B, L), (B,)
