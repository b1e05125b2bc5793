"""The table of position schemes says what each scheme does: every
field of every row checked against what the models then do."""

import pytest
import torch

from transformer_lite import make_model
from transformer_lite.lm import make_lm
from transformer_lite.schemes import (
    POSITIONS,
    SCHEMES,
    check_widths,
    relative_positions,
    scheme,
)
from transformer_lite.shipping.export import _check_model

SIZES = dict(n_layers=2, d_model=16, d_ff=32, n_heads=2, dropout=0.0)


def attention_positions(stack):
    return [layer.self_attn.position for layer in stack.layers]


@pytest.mark.parametrize("position", POSITIONS)
def test_absolute_and_shared_say_where_a_scheme_sits(position):
    s = scheme(position)
    model = make_model(11, 11, **SIZES, position=position)
    encoder = attention_positions(model.encoder)
    decoder = attention_positions(model.decoder)
    if s.absolute:
        assert encoder == decoder == [None, None]
        assert type(model.positional) is s.embedding
        return
    assert None not in encoder + decoder
    assert (encoder[0] is encoder[1]) == s.shared
    assert (decoder[0] is decoder[1]) == s.shared
    assert encoder[0] is not decoder[0]  # one module per stack at most


@pytest.mark.parametrize("position", POSITIONS)
def test_a_table_is_what_a_segment_memory_refuses(position):
    lm = make_lm(20, n_layers=1, d_model=16, d_ff=32, n_heads=2,
                 dropout=0.0, position=position).eval()  # fmt: skip
    tokens = torch.randint(4, 20, (2, 5))
    memory = lm.new_memory(4)
    if scheme(position).table:
        with pytest.raises(ValueError, match="needs relative positions"):
            lm(tokens, memory=memory)
    else:
        assert lm(tokens, memory=memory).shape == (2, 5, 20)


@pytest.mark.parametrize("position", POSITIONS)
def test_exportable_is_what_the_export_takes(position):
    model = make_model(11, 11, **SIZES, position=position).eval()
    if scheme(position).exportable:
        assert _check_model(model) is model
    else:
        with pytest.raises(ValueError, match="absolute positions"):
            _check_model(model)


@pytest.mark.parametrize("position", POSITIONS)
def test_even_heads_is_what_an_odd_head_width_breaks(position):
    if scheme(position).even_heads:
        with pytest.raises(ValueError, match="rotates pairs"):
            check_widths(12, 4, position)  # heads of width 3
    else:
        check_widths(12, 4, position)
        model = make_model(11, 11, n_layers=1, d_model=12, d_ff=8,
                           n_heads=4, position=position)  # fmt: skip
        assert model(torch.tensor([[1, 5, 6]]), torch.tensor([[1, 7]])).shape


def unstored_elements(model) -> int:
    stored = set(model.state_dict())
    return sum(b.numel() for n, b in model.named_buffers() if n not in stored)


@pytest.mark.parametrize("position", POSITIONS)
def test_built_and_parameters_count_what_the_model_holds(position):
    """``built`` is what grows with max_len among the buffers no
    checkpoint stores (ALiBi's slopes do not grow); ``parameters`` is
    what the scheme adds to a model without positions."""
    s = scheme(position)
    model = make_model(11, 11, **SIZES, max_len=40, position=position)
    longer = make_model(11, 11, **SIZES, max_len=80, position=position)
    grown = unstored_elements(longer) - unstored_elements(model)
    assert s.built(16, 80) - s.built(16, 40) == grown
    assert s.built(16, 40) <= unstored_elements(model)
    plain = make_model(11, 11, **SIZES, max_len=40, position="none")
    learned = model.count_parameters() - plain.count_parameters()
    assert s.parameters(model.config, stacks=2) == learned


def test_every_scheme_has_one_row_and_a_clear_lookup():
    assert POSITIONS == tuple(SCHEMES) and len(set(POSITIONS)) == 7
    assert all(SCHEMES[p].name == p for p in POSITIONS)
    assert all(SCHEMES[p].layers is None for p in POSITIONS
               if SCHEMES[p].absolute)  # fmt: skip
    with pytest.raises(ValueError, match="position must be one of"):
        scheme("relative")
    model_config = make_model(11, 11, **SIZES, position="t5").config
    encoder, decoder = (relative_positions(model_config, causal=c)
                        for c in (False, True))  # fmt: skip
    assert encoder[0].bidirectional and not decoder[0].bidirectional
