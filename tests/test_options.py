"""Options are checked before work starts: a bool is not an int, a str
is not a bool, a float is not a token id, and the message names the
option (transformer_lite.checks and its callers)."""

import pytest
import torch
from torch import nn

from transformer_lite import (
    SinusoidalPositionalEncoding,
    TransformerConfig,
    causal_mask,
    seed_everything,
    sinusoidal_table,
)
from transformer_lite.checks import check_bool, check_int, check_real
from transformer_lite.interop import (
    from_torch_decoder_layer,
    from_torch_encoder_layer,
)
from transformer_lite.masks import local_mask


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(norm_first="no"), "norm_first"),
        (dict(norm_first=0), "norm_first"),
        (dict(tie_embeddings="yes"), "tie_embeddings"),
        (dict(pad_id=1.0), "pad_id"),
        (dict(pad_id=True), "pad_id"),
        (dict(n_layers=True), "n_layers"),
        (dict(d_model=64.0), "d_model"),
        (dict(dropout=True), "dropout"),
        (dict(dropout="0.1"), "dropout"),
        (dict(dropout=float("nan")), "dropout"),
        (dict(max_len=None), "max_len"),
    ],
)
def test_config_rejects_wrong_types(fields, named):
    with pytest.raises(ValueError, match=named):
        TransformerConfig(11, 11, **fields)


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: seed_everything(True), "seed"),
        (lambda: seed_everything(2**64), "seed"),
        (lambda: seed_everything(None), "seed"),
        (lambda: causal_mask(True), "size"),
        (lambda: local_mask(4, True), "window"),
        (lambda: sinusoidal_table(True, 4), "max_len"),
        (lambda: sinusoidal_table(8, 4, base=0.0), "base"),
    ],
)
def test_core_functions_reject_bools_with_a_clear_error(call, named):
    with pytest.raises(ValueError, match=named):
        call()


@pytest.mark.parametrize("offset", [-1, -5, 1.0, True])
def test_positional_offset_must_be_a_non_negative_int(offset):
    """A negative offset used to read rows from the end of the table (or
    row 0): silently wrong positions."""
    pe = SinusoidalPositionalEncoding(8, dropout=0.0, max_len=10)
    with pytest.raises(ValueError, match="offset"):
        pe(torch.zeros(1, 2, 8), offset)


@pytest.mark.parametrize(
    "convert, layer",
    [
        (from_torch_encoder_layer, nn.TransformerEncoderLayer),
        (from_torch_decoder_layer, nn.TransformerDecoderLayer),
    ],
)
def test_interop_refuses_layers_without_biases(convert, layer):
    theirs = layer(8, 2, 16, batch_first=True, bias=False)
    with pytest.raises(ValueError, match="bias"):
        convert(theirs)


def test_the_checks_themselves():
    assert check_int("n", 3, low=1) == 3
    assert check_real("p", 1, low=0.0) == 1.0
    assert check_bool("b", False) is False
    for call, message in [
        (lambda: check_int("n", True), "n must be an int"),
        (lambda: check_int("n", 0, low=1), "n must be a positive int"),
        (lambda: check_int("n", -1, low=0), "non-negative"),
        (lambda: check_int("n", 9, low=1, high=5), r"\[1, 5\]"),
        (lambda: check_real("p", 1.0, high=1.0, high_open=True), r"1.0\)"),
        (lambda: check_real("p", float("inf")), "finite"),
        (lambda: check_bool("b", "no"), "True or False"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
