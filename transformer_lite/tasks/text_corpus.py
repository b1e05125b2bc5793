"""A language-model corpus that ships with Python (chapter 10).

``pydoc_data.topics`` holds the text that ``help("if")`` and the other
``help`` topics print: the language reference's chapters on statements,
expressions, types and so on, about 465,000 characters of English prose
with Python code between it, generated from the Python documentation
(Copyright Python Software Foundation, PSF License). It is in every
Python installation, so the corpus needs no download; its text varies
slightly between Python versions.

The text is tokenised by characters (:class:`CharTokenizer`), split into
training and held-out text, and cut into B parallel streams that are
read one segment after another: the layout Transformer-XL needs, in
which segment j + 1 of a row continues segment j.
"""

import re
from collections import Counter
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from transformer_lite.lm.perplexity import segments
from transformer_lite.tasks.corpus import check_sizes, generator
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_lite.training.batch import Examples

__all__ = [
    "CharTokenizer",
    "corpus_splits",
    "pydoc_topics",
    "repeated_segments",
    "segment_batches",
    "shared_spans",
    "streams",
]

SPECIAL = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>", UNK_ID: "<unk>"}


def pydoc_topics() -> dict[str, str]:
    """The ``help()`` topics of this Python: name -> text."""
    from pydoc_data.topics import topics

    return dict(topics)


PARAGRAPH = re.compile(r"\n[ \t]*\n")  # a blank line ends a paragraph
SPAN = 60  # characters: a held-out stretch this long is never trained on


def corpus_splits(
    held_out: float = 0.1, *, span: int = SPAN
) -> tuple[str, str]:
    """Training and held-out text that share no stretch of ``span``
    characters.

    The help topics repeat each other: one section is printed under
    several topics, and a sentence of boilerplate under many. So the
    topics are first cut into paragraphs (at blank lines) and every
    paragraph is kept once, where it first occurs, taking the topics in
    the order of their names. The last ``held_out`` of each topic's
    paragraphs is held out, so both parts sample many subjects; a
    held-out paragraph that still shares ``span`` characters with the
    training text is dropped. Paragraphs are joined by a blank line.

    Returns:
        ``(train, held_out)`` text; ``shared_spans(held_out, train,
        span)`` is 0.
    """
    if not isinstance(held_out, float) or not 0.0 < held_out < 1.0:
        raise ValueError(
            f"held_out must be a float in (0, 1), got {held_out!r}"
        )
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ValueError(f"span must be an int >= 1, got {span!r}")
    seen: set[str] = set()
    train: list[str] = []
    tails: list[str] = []
    for _, text in sorted(pydoc_topics().items()):
        kept = []
        for paragraph in PARAGRAPH.split(text):
            key = paragraph.strip()
            if key and key not in seen:
                seen.add(key)
                kept.append(paragraph)
        total = sum(map(len, kept))
        trained = 0
        for paragraph in kept:
            if trained < (1.0 - held_out) * total:
                train.append(paragraph)
                trained += len(paragraph)
            else:
                tails.append(paragraph)
    train_text = "\n\n".join(train)
    known = _span_hashes(train_text, span)
    held: list[str] = []
    for paragraph in tails:
        # Joined to the paragraph before it, a paragraph makes new
        # stretches across the blank line: those count too.
        joined = held[-1][-span:] + "\n\n" + paragraph if held else paragraph
        if not _span_hashes(joined, span) & known:
            held.append(paragraph)
    return train_text, "\n\n".join(held)


def _span_hashes(text: str, span: int) -> set[int]:
    return {hash(text[i : i + span]) for i in range(len(text) - span + 1)}


def shared_spans(text: str, reference: str, span: int = SPAN) -> int:
    """How many of text's stretches of ``span`` characters (one starting
    at each character) occur anywhere in ``reference``."""
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ValueError(f"span must be an int >= 1, got {span!r}")
    known = _span_hashes(reference, span)
    return sum(
        hash(text[i : i + span]) in known for i in range(len(text) - span + 1)
    )


class CharTokenizer:
    """One token per character, after the package's special tokens.

    Ids 0-3 are ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>``
    (:mod:`transformer_lite.tokens`); then every character seen at least
    ``min_count`` times in the training text, in code-point order. Other
    characters become ``<unk>``.

    Args:
        text: the training text the vocabulary is taken from.
        min_count: how often a character must occur to get its own id.
    """

    def __init__(self, text: str, min_count: int = 1) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty str")
        check_sizes(min_count=min_count)
        counts = Counter(text)
        chars = sorted(c for c, n in counts.items() if n >= min_count)
        first = len(SPECIAL)
        self.chars = chars
        self.ids = {c: first + i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        """V: the special tokens and the characters."""
        return len(SPECIAL) + len(self.chars)

    def encode(self, text: str) -> Tensor:
        """Token ids of ``text``, one per character.

        Shape:
            output: (len(text),), int64.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = [self.ids.get(c, UNK_ID) for c in text]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """Text of ``ids``; special tokens are written as ``<unk>`` etc."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        first = len(SPECIAL)
        out = []
        for i in ids:
            if (
                isinstance(i, bool)
                or not isinstance(i, int)
                or not 0 <= i < self.vocab_size
            ):
                raise ValueError(
                    f"token id {i!r} is outside [0, {self.vocab_size})"
                )
            out.append(SPECIAL[i] if i < first else self.chars[i - first])
        return "".join(out)


def streams(ids: Tensor, n_streams: int) -> Tensor:
    """Cut one long sequence of ids into ``n_streams`` rows of equal
    length, row b continuing where row b - 1 stops (the last
    len(ids) mod B ids are dropped).

    Shape:
        ids: (N,); output: (B, N // B).
    """
    check_sizes(n_streams=n_streams)
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    length = ids.numel() // n_streams
    if length < 2:
        raise ValueError(
            f"{ids.numel()} ids are too few for {n_streams} streams"
        )
    return ids[: n_streams * length].view(n_streams, length)  # (B, N // B)


def segment_batches(
    stream: Tensor, segment_len: int, steps: int
) -> Iterator[Examples]:
    """``steps`` training batches: the consecutive segments of
    ``stream``, from the start again when they run out (an epoch).

    Yields:
        :class:`~transformer_lite.training.batch.Examples` of the
        segment's inputs and next tokens, padding ignored;
        ``starts_stream`` is True for the first segment of an epoch, the
        only batch whose text does not continue the previous one (a
        segment memory must be cleared there).

    Shape:
        stream: (B, L); inputs, targets: (B, T) each; the last segment
        of an epoch is dropped if shorter than T.
    """
    check_sizes(segment_len=segment_len, steps=steps)
    if stream.size(1) <= segment_len:
        raise ValueError(
            f"stream rows of {stream.size(1)} tokens are too short for "
            f"segments of {segment_len}"
        )
    done = 0
    while True:
        for j, (inputs, targets) in enumerate(segments(stream, segment_len)):
            if inputs.size(1) < segment_len:
                break
            yield Examples(inputs, targets, PAD_ID, starts_stream=j == 0)
            done += 1
            if done == steps:
                return


def repeated_segments(
    n_streams: int,
    n_segments: int,
    segment_len: int,
    n_symbols: int,
    generator_or_seed: torch.Generator | int,
) -> Tensor:
    """Streams whose every segment repeats the previous one: a random
    block of ``segment_len`` symbols, then the same block again and
    again. After the first segment, each next token is the one T places
    back, in the previous segment; from within the segment (a plain
    model's context) only the last one is visible.

    The symbols are ids after the special tokens: len(SPECIAL) ..
    len(SPECIAL) + n_symbols - 1.

    Shape:
        output: (B, n_segments * T + 1): the extra token lets the last
        segment predict its last position.
    """
    check_sizes(
        n_streams=n_streams,
        n_segments=n_segments,
        segment_len=segment_len,
        n_symbols=n_symbols,
    )
    g = generator(generator_or_seed)
    block = torch.randint(
        len(SPECIAL),
        len(SPECIAL) + n_symbols,
        (n_streams, segment_len),
        generator=g,
    )  # (B, T)
    stream = block.repeat(1, n_segments + 1)  # (B, (n_segments + 1) * T)
    return stream[:, : n_segments * segment_len + 1]
