"""Subword tokens by byte-pair encoding (chapter 7).

A word-level vocabulary cannot spell a word it has never seen; a
character-level one makes sequences long. Byte-pair encoding (Sennrich et
al., 2016) starts from characters and merges the most frequent adjacent
pair, again and again, until the vocabulary has the size asked for: frequent
words end up as one token, rare ones as a few pieces. German number words
such as "vierhunderteinundzwanzig" split into "vierhundert", "einund",
"zwanzig".

:class:`SubwordTokenizer` wraps a trained ``tokenizers.Tokenizer`` (the
Hugging Face package, which trains offline in well under a second here).
Words are split at spaces and punctuation before the merges; a leading
``▁`` marks a piece that starts a word, so that decoding restores the
spaces exactly.
"""

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from transformer_lite.extras import require
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

tokenizers = require("tokenizers", "translate")

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "SubwordTokenizer",
]

# The special tokens at the package's ids (transformer_lite.tokens), so
# every task shares one convention; <unk> follows them.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


class SubwordTokenizer:
    """Byte-pair-encoding tokenizer with ``<pad>``, ``<bos>``, ``<eos>``
    and ``<unk>`` at ids 0, 1, 2 and 3.

    Build one with :meth:`train`, or :meth:`load` / :meth:`from_json` a
    saved one.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` whose vocabulary starts with
            ``SPECIAL_TOKENS`` in that order.
    """

    def __init__(self, tokenizer) -> None:
        for i, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != i:
                raise ValueError(
                    f"the tokenizer must have {token!r} at id {i}, got "
                    f"{tokenizer.token_to_id(token)!r}"
                )
        self.tokenizer = tokenizer

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int
    ) -> "SubwordTokenizer":
        """Learn BPE merges from ``texts`` until the vocabulary (special
        tokens included) has ``vocab_size`` entries, or no pair is left
        to merge. Characters never seen become ``<unk>``."""
        Tokenizer, decoders = tokenizers.Tokenizer, tokenizers.decoders
        models, normalizers = tokenizers.models, tokenizers.normalizers
        pre_tokenizers = tokenizers.pre_tokenizers
        trainers = tokenizers.trainers
        if not isinstance(vocab_size, int) or vocab_size <= len(
            SPECIAL_TOKENS
        ):
            raise ValueError(
                f"vocab_size must be an int > {len(SPECIAL_TOKENS)}, got "
                f"{vocab_size!r}"
            )
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.NFC()  # "ü" is one character
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()]
        )
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        tokenizer.train_from_iterator(list(texts), trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        """V, special tokens included."""
        return self.tokenizer.get_vocab_size()

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of ``text``, without special tokens."""
        return self.tokenizer.encode(text).tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: BOS, the pieces, EOS."""
        return [BOS_ID, *self.tokenizer.encode(text).ids, EOS_ID]

    def encode_batch(self, texts: Sequence[str]) -> Tensor:
        """Encode several texts and pad them with PAD_ID to one length.

        Shape:
            output: (B, L), L the longest encoding (BOS and EOS included).
        """
        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty sequence of str")
        rows = [self.encode(text) for text in texts]
        ids = torch.full((len(rows), max(map(len, rows))), PAD_ID)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return ids  # (B, L)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``, up to the first EOS; special tokens are
        dropped."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        ids = list(ids)
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decode_batch(self, ids: Tensor) -> list[str]:
        """:meth:`decode` for every row.

        Shape:
            ids: (B, L).
        """
        return [self.decode(row) for row in ids.tolist()]

    def to_json(self) -> str:
        """The whole tokenizer as a JSON string (store it in a
        checkpoint's extra data)."""
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> "SubwordTokenizer":
        return cls(tokenizers.Tokenizer.from_str(text))

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SubwordTokenizer":
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def __repr__(self) -> str:
        return f"SubwordTokenizer(vocab_size={self.vocab_size})"
