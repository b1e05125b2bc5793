"""A trained translation model with its tokenizers (chapter 7).

:class:`Translator` turns text into text: it tokenizes, decodes with beam
search and detokenizes, and it saves and loads the model together with
both tokenizers in one checkpoint file. A translator of number words
also knows its domain (:class:`~transformer_lite.tasks.numbers.NumberDomain`):
it refuses inputs outside it and flags answers that do not round-trip.
"""

import os
from collections.abc import Sequence

from transformer_lite.checks import check_int, check_real
from transformer_lite.decoding import beam_search
from transformer_lite.model import Transformer
from transformer_lite.tasks.numbers import NumberDomain
from transformer_lite.tasks.tokenizer import SubwordTokenizer as Tokenizer
from transformer_lite.tokens import BOS_ID, EOS_ID
from transformer_lite.training.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)

__all__ = ["Translator"]


class Translator:
    """A trained model with its source and target tokenizers.

    Args:
        model: a :class:`~transformer_lite.model.Transformer`.
        src_tokenizer, tgt_tokenizer: the tokenizers it was trained with.
        domain: what it was trained on, if it translates number words;
            None (a model of a corpus): no check of meaning.
    """

    def __init__(
        self,
        model: Transformer,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        domain: NumberDomain | None = None,
    ) -> None:
        if domain is not None and not isinstance(domain, NumberDomain):
            raise ValueError(
                f"domain must be a NumberDomain or None, got {domain!r:.60}"
            )
        self.model = model
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.domain = domain

    def problem(self, text: object) -> str | None:
        """Why ``text`` cannot be translated (not a str, more source
        tokens than the model's ``max_len``, or outside the domain), or
        None if it can."""
        if not isinstance(text, str):
            return f"not a str but a {type(text).__name__}"
        n_tokens = len(self.src_tokenizer.encode(text))
        longest = self.model.config.max_len
        if n_tokens > longest:
            return (
                f"{n_tokens} tokens long (BOS and EOS included), more than "
                f"the model's max_len={longest}"
            )
        if self.domain is not None:
            return self.domain.problem(text)
        return None

    def doubt(self, text: str, translation: str) -> str | None:
        """Why ``translation`` of ``text`` cannot be right (it does not
        round-trip, :meth:`NumberDomain.doubt`), or None; always None
        without a domain."""
        if self.domain is None:
            return None
        return self.domain.doubt(text, translation)

    def translate(
        self,
        texts: Sequence[str],
        beam_size: int = 4,
        length_penalty: float = 0.6,
        batch_size: int = 500,
    ) -> list[str]:
        """Translate ``texts``, ``batch_size`` at a time and sorted by
        length, with :func:`~transformer_lite.decoding.beam_search`
        (``beam_size=1``: greedy). Outputs stop at 2 S + 10 tokens for
        a batch of S source tokens (or at the model's ``max_len``).

        Every option and every text is checked before any is translated:
        a ``ValueError`` names each text that cannot be (see
        :meth:`problem`), so one long text never costs a whole batch.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ValueError("texts must be a list of str, not one str")
        check_int("beam_size", beam_size, low=1)
        check_real("length_penalty", length_penalty, low=0.0)
        check_int("batch_size", batch_size, low=1)
        problems = [
            f"text {i}: {why}"
            for i, why in enumerate(map(self.problem, texts))
            if why is not None
        ]
        if problems:
            raise ValueError("cannot translate " + "; ".join(problems))
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = [""] * len(texts)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            src = self.src_tokenizer.encode_batch([texts[i] for i in chunk])
            ys = beam_search(
                self.model,
                src,
                max_len=min(2 * src.size(1) + 10, self.model.config.max_len),
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                beam_size=beam_size,
                length_penalty=length_penalty,
            )  # (B, L)
            texts_out = self.tgt_tokenizer.decode_batch(ys)
            for i, text in zip(chunk, texts_out, strict=True):
                out[i] = text
        return out

    def save(self, path: str | os.PathLike, **extra: object) -> None:
        """A checkpoint as ``save_checkpoint`` writes it
        (:mod:`transformer_lite.training.checkpoint`), holding the
        tokenizers too; loads with ``weights_only=True``."""
        if self.domain is not None:
            extra = {"domain": self.domain.to_dict(), **extra}
        save_checkpoint(
            path,
            self.model,
            src_tokenizer=self.src_tokenizer.to_json(),
            tgt_tokenizer=self.tgt_tokenizer.to_json(),
            **extra,
        )

    @classmethod
    def load(
        cls, path: str | os.PathLike, map_location: str | None = None
    ) -> "Translator":
        model, extra = load_checkpoint(path, map_location=map_location)
        return cls.from_model(model, extra)

    @classmethod
    def from_model(cls, model: Transformer, extra: dict) -> "Translator":
        """From a model and the extra data of its checkpoint (its
        tokenizers, and its domain if it has one)."""
        tokenizers = []
        for name in ("src_tokenizer", "tgt_tokenizer"):
            if not isinstance(extra.get(name), str):
                raise ValueError(f"the checkpoint holds no {name}")
            try:
                tokenizers.append(Tokenizer.from_json(extra[name]))
            except Exception as err:  # tokenizers raises plain Exception
                raise ValueError(
                    f"the checkpoint's {name} is not a tokenizer: {err}"
                ) from err
        vocabs = model.config.src_vocab, model.config.tgt_vocab
        for tokenizer, vocab, side in zip(
            tokenizers, vocabs, ("source", "target"), strict=True
        ):
            if tokenizer.vocab_size > vocab:
                raise ValueError(
                    f"the {side} tokenizer has {tokenizer.vocab_size} "
                    f"tokens, the model only {vocab}"
                )
        domain = None
        if "domain" in extra:
            try:
                domain = NumberDomain.from_dict(extra["domain"])
            except ValueError as err:
                raise ValueError(f"the checkpoint's domain: {err}") from err
        return cls(model.eval(), *tokenizers, domain=domain)
