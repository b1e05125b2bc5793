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
    streams,
)
from transformer_lite.tokens import UNK_ID


def test_the_split_holds_out_the_end_of_every_topic():
    topics = pydoc_topics()
    train, held_out = corpus_splits(0.1)
    assert len(train) + len(held_out) == sum(map(len, topics.values()))
    assert 0.09 < len(held_out) / (len(train) + len(held_out)) < 0.11
    for text in list(topics.values())[:5]:
        cut = round(len(text) * 0.9)
        assert text[:cut] in train and text[cut:] in held_out


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
        assert torch.equal(got[0], expected)
    assert [first for _, _, first in batches] == [1, 0, 0, 1, 0]
    x, y, _ = batches[0]
    assert torch.equal(y, x + 1)  # targets are the next tokens


def test_every_repeated_segment_is_the_previous_one():
    stream = repeated_segments(3, 4, 5, 6, generator_or_seed=0)
    assert stream.shape == (3, 4 * 5 + 1)
    assert torch.equal(stream[:, 5:], stream[:, :-5])
    assert stream.min() >= len(SPECIAL) and stream.max() < len(SPECIAL) + 6
    again = repeated_segments(3, 4, 5, 6, generator_or_seed=0)
    assert torch.equal(stream, again)
