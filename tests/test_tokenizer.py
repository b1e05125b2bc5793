"""Tests for transformer_lite.tasks.tokenizer (chapter 7): BPE round trips."""

import pytest

from transformer_lite.tasks.numbers import number_pairs
from transformer_lite.tasks.tokenizer import (
    SPECIAL_TOKENS,
    UNK_ID,
    SubwordTokenizer,
)
from transformer_lite.tokens import BOS_ID, EOS_ID, PAD_ID

TRAIN = [src for src, _ in number_pairs(list(range(0, 3000, 7)), "de-en")]
UNSEEN = ["neunhundertneunundneunzigtausendeins", "siebenundachtzig"]


@pytest.fixture(scope="module")
def tokenizer() -> SubwordTokenizer:
    return SubwordTokenizer.train(TRAIN, vocab_size=60)


def test_special_tokens_have_fixed_ids(tokenizer):
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.tokenizer.token_to_id(token) == i
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)


TEXTS = TRAIN[:50] + UNSEEN + ["vier drei", "achtzig sieben"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == text


def test_pieces_join_to_the_word(tokenizer):
    pieces = tokenizer.pieces("vierhunderteinundzwanzig")
    assert len(pieces) > 1  # a compound splits into pieces
    assert "".join(pieces).lstrip("▁") == "vierhunderteinundzwanzig"
    assert tokenizer.encode("hundert")[1:-1] == [
        tokenizer.tokenizer.token_to_id(p) for p in tokenizer.pieces("hundert")
    ]


def test_vocabulary_size_and_merges():
    small = SubwordTokenizer.train(TRAIN, vocab_size=40)
    large = SubwordTokenizer.train(TRAIN, vocab_size=120)
    assert small.vocab_size == 40 and large.vocab_size == 120
    text = "siebenhundertdreiundzwanzig"
    assert len(large.pieces(text)) < len(small.pieces(text))


def test_unknown_characters_become_unk(tokenizer):
    ids = tokenizer.encode("vier€")
    assert UNK_ID in ids
    assert tokenizer.decode(ids) == "vier"  # special tokens are dropped


def test_decode_stops_at_eos_and_skips_padding(tokenizer):
    ids = tokenizer.encode("dreizehn")
    assert tokenizer.decode(ids + [PAD_ID, PAD_ID]) == "dreizehn"
    assert tokenizer.decode(ids + tokenizer.encode("vier")[1:]) == "dreizehn"


def test_batches_are_padded(tokenizer):
    texts = ["eins", "neunhundertneunundneunzig"]
    ids = tokenizer.encode_batch(texts)  # (B, L)
    assert ids.shape == (2, len(tokenizer.encode(texts[1])))
    assert ids[0, len(tokenizer.encode(texts[0])) :].eq(PAD_ID).all()
    assert tokenizer.decode_batch(ids) == texts
    with pytest.raises(ValueError, match="non-empty"):
        tokenizer.encode_batch([])


def test_save_and_load_give_the_same_tokens(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    loaded = SubwordTokenizer.load(path)
    again = SubwordTokenizer.from_json(tokenizer.to_json())
    for text in TRAIN[:20] + UNSEEN:
        assert loaded.encode(text) == tokenizer.encode(text)
        assert again.encode(text) == tokenizer.encode(text)


def test_training_is_deterministic():
    first = SubwordTokenizer.train(TRAIN, vocab_size=60)
    second = SubwordTokenizer.train(TRAIN, vocab_size=60)
    assert first.to_json() == second.to_json()


def test_nfc_normalisation(tokenizer):
    decomposed = "fu\u0308nf"  # u + combining diaeresis
    assert tokenizer.encode(decomposed) == tokenizer.encode("fünf")


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        SubwordTokenizer.train(TRAIN, vocab_size=4)
    from tokenizers import Tokenizer, models

    with pytest.raises(ValueError, match="<pad>"):
        SubwordTokenizer(Tokenizer(models.BPE()))
