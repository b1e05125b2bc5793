"""The language-model corpus: pydoc_data's text split without overlap,
characters as tokens, parallel streams, consecutive segments, and the
repeated-segment task."""

import pytest
import torch

from transformer_lite.lm import segments
from transformer_lite.tasks.text_corpus import (
    SPECIAL,
    CharTokenizer,
    corpus_splits,
    pydoc_topics,
    repeated_segments,
    segment_batches,
    shared_spans,
    streams,
)
from transformer_lite.tokens import PAD_ID, UNK_ID


def test_the_raw_topics_repeat_each_other():
    # Why the split deduplicates: cut naively at 90% of every topic, a
    # quarter of the held-out text is found word for word in training.
    train, held = [], []
    for _, text in sorted(pydoc_topics().items()):
        cut = round(len(text) * 0.9)
        train.append(text[:cut])
        held.append(text[cut:])
    naive = shared_spans("".join(held), "".join(train))
    assert naive > 0.2 * len("".join(held))


def test_no_held_out_stretch_of_60_characters_is_trained_on():
    train, held_out = corpus_splits(0.1)
    assert shared_spans(held_out, train, 60) == 0
    total = sum(map(len, pydoc_topics().values()))
    # Deduplication keeps about four fifths of the text; a tenth of that
    # is held out, less the few paragraphs that still overlap.
    assert 0.7 * total < len(train) + len(held_out) < 0.9 * total
    assert 0.07 < len(held_out) / (len(train) + len(held_out)) < 0.1


def test_every_paragraph_is_kept_once_and_every_topic_is_sampled():
    train, held_out = corpus_splits(0.1)
    paragraphs = [p.strip() for p in (train + "\n\n" + held_out).split("\n\n")]
    paragraphs = [p for p in paragraphs if p]
    assert len(paragraphs) == len(set(paragraphs))
    topics = pydoc_topics()
    sampled = [
        name
        for name, text in topics.items()
        if any(
            len(p) > 100 and p.strip() in held_out for p in text.split("\n\n")
        )
    ]
    assert len(sampled) > 0.3 * len(topics)  # 31 of 79 on Python 3.11
    assert topics["assert"].split("\n\n")[0].strip() in train


def test_shared_spans_counts_every_window():
    assert shared_spans("abcdef", "xxbcdxx", 3) == 1  # "bcd"
    assert shared_spans("abcabc", "abc", 3) == 2
    assert shared_spans("ab", "ab", 3) == 0
    with pytest.raises(ValueError, match="span must be an int"):
        shared_spans("a", "a", 0)
    with pytest.raises(ValueError, match="span must be an int"):
        corpus_splits(0.1, span=True)


@pytest.mark.parametrize("held_out", [0.0, 1.0, 1, "0.1"])
def test_a_bad_split_is_refused(held_out):
    with pytest.raises(ValueError, match="held_out must be a float"):
        corpus_splits(held_out)


def test_characters_round_trip_and_unknown_ones_become_unk():
    tok = CharTokenizer("hello, world", min_count=1)
    assert tok.vocab_size == len(SPECIAL) + len(set("hello, world"))
    ids = tok.encode("hello")
    assert ids.tolist()[0] >= len(SPECIAL) and tok.decode(ids) == "hello"
    assert tok.encode("hex").tolist()[-1] == UNK_ID
    assert tok.decode([UNK_ID]) == "<unk>"
    rare = CharTokenizer("aaab", min_count=2)
    assert rare.encode("ab").tolist() == [len(SPECIAL), UNK_ID]
    with pytest.raises(ValueError, match="outside"):
        tok.decode([tok.vocab_size])


def test_streams_continue_each_other():
    ids = torch.arange(23)
    rows = streams(ids, 4)
    assert rows.shape == (4, 5)
    assert torch.equal(rows.flatten(), ids[:20])
    with pytest.raises(ValueError, match="too few"):
        streams(ids[:7], 4)


def test_segment_batches_are_consecutive_and_start_again():
    stream = torch.arange(22).view(2, 11)
    batches = list(segment_batches(stream, 3, steps=5))
    assert len(batches) == 5
    epoch = [x for x, _ in segments(stream, 3)][:3]  # the full ones
    for got, expected in zip(batches, epoch + epoch[:2], strict=True):
        assert torch.equal(got.inputs[0], expected)
    assert [b.starts_stream for b in batches] == [1, 0, 0, 1, 0]
    (x,), y = batches[0].inputs, batches[0].targets
    assert torch.equal(y, x + 1)  # targets are the next tokens
    assert batches[0].ignore_index == PAD_ID  # padding is not learned
    assert batches[0].n_tokens == int((y != PAD_ID).sum())


def test_every_repeated_segment_is_the_previous_one():
    stream = repeated_segments(3, 4, 5, 6, generator_or_seed=0)
    assert stream.shape == (3, 4 * 5 + 1)
    assert torch.equal(stream[:, 5:], stream[:, :-5])
    assert stream.min() >= len(SPECIAL) and stream.max() < len(SPECIAL) + 6
    again = repeated_segments(3, 4, 5, 6, generator_or_seed=0)
    assert torch.equal(stream, again)


def test_a_bool_is_not_a_token_id():
    # Before: decode([True]) returned "<bos>".
    tok = CharTokenizer("hello")
    with pytest.raises(ValueError, match="token id True"):
        tok.decode([True])
