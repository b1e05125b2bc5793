"""Tests for transformer_lite.schemes (chapter 9). The table of position
schemes says what each scheme does: every field of every row checked
against what the models then do. And ``TransformerConfig``'s
``position`` puts each scheme where it belongs (the table or module
each layer holds, against a list written out here), unknown or
misplaced schemes are clear errors, relative schemes ignore where the
source starts, and every scheme learns the copy task."""

import pytest
import torch
from conftest import padded_src_tgt

from transformer_lite import (
    MultiHeadAttention,
    RelativePosition,
    TransformerConfig,
    make_model,
    padding_mask,
)
from transformer_lite.lm import make_lm
from transformer_lite.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from transformer_lite.relative import (
    ALiBiBias,
    ShawRelativeKeys,
    T5RelativeBias,
)
from transformer_lite.rotary import RotaryEmbedding
from transformer_lite.schemes import (
    POSITIONS,
    SCHEMES,
    check_widths,
    relative_positions,
    scheme,
)
from transformer_lite.shipping.export import _check_model
from transformer_lite.tasks.copy_task import copy_task_batches
from transformer_lite.training import (
    LabelSmoothingLoss,
    seq2seq_loss,
    train_step,
)

SIZES = dict(n_layers=2, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
FOUR_HEADS = dict(n_layers=2, d_model=16, d_ff=32, n_heads=4)


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
    assert s.elements_built(16, 80) - s.elements_built(16, 40) == grown
    assert s.elements_built(16, 40) <= unstored_elements(model)
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


# ----------------------------------------------------------------------------
# Where each scheme sits in a model, and what it does there


def test_default_is_the_papers_sinusoidal_table_and_nothing_else():
    model = make_model(11, 11, **FOUR_HEADS)
    assert model.config.position == "sinusoidal"
    assert isinstance(model.positional, SinusoidalPositionalEncoding)
    assert all(
        m.position is None
        for m in model.modules()
        if isinstance(m, MultiHeadAttention)
    )


ABSOLUTE = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "learned": LearnedPositionalEmbedding,
    "none": NoPositionalEncoding,
}
RELATIVE = {
    "rope": RotaryEmbedding,
    "alibi": ALiBiBias,
    "t5": T5RelativeBias,
    "shaw": ShawRelativeKeys,
}


@pytest.mark.parametrize("position", POSITIONS)
def test_each_scheme_sits_where_it_belongs(position):
    model = make_model(11, 11, **FOUR_HEADS, position=position)
    kind = ABSOLUTE.get(position, NoPositionalEncoding)
    assert type(model.positional) is kind
    encoder = attention_positions(model.encoder)
    decoder = attention_positions(model.decoder)
    for layer in model.decoder.layers:  # no offset between S and T
        assert layer.cross_attn.position is None
    if position in ABSOLUTE:
        assert encoder == decoder == [None, None]
        return
    assert all(type(p) is RELATIVE[position] for p in encoder + decoder)
    shared = position != "shaw"  # Shaw: one table per layer
    assert (encoder[0] is encoder[1]) == shared
    assert (decoder[0] is decoder[1]) == shared
    if position == "t5":  # one table per stack, each its own direction
        assert encoder[0] is not decoder[0]
        assert encoder[0].bidirectional and not decoder[0].bidirectional


def test_an_unknown_scheme_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match="position must be one of "
        "sinusoidal, learned, none, rope, alibi, t5, shaw",
    ):
        TransformerConfig(11, 11, position="relative")
    with pytest.raises(ValueError, match="must be a RelativePosition"):
        MultiHeadAttention(8, 2, position=SinusoidalPositionalEncoding(8))
    with pytest.raises(ValueError, match="serves self-attention"):
        mha = MultiHeadAttention(8, 2, position=ALiBiBias(2))
        # more queries than keys: the queries cannot be the last keys
        mha(torch.zeros(1, 4, 8), torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))


@pytest.mark.parametrize("position", POSITIONS)
def test_every_scheme_learns_the_copy_task(position, one_thread):
    """A few steps on the copy task: the loss falls and stays finite."""
    torch.manual_seed(0)
    V = 10
    model = make_model(V, V, **FOUR_HEADS, dropout=0.0, position=position)
    objective = seq2seq_loss(LabelSmoothingLoss(V, 0, 0.0, reduction="sum"))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = copy_task_batches(40, 32, 6, V, 1, min_len=2)
    losses = [train_step(model, [b], objective, optimizer) for b in batches]
    assert all(torch.isfinite(torch.tensor(losses)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "shaw"])
def test_a_relative_encoder_ignores_where_the_source_starts(position):
    """With relative positions alone, self-attention sees offsets only:
    the encoder's output for a sequence does not change when queries and
    keys sit at positions t .. t + L - 1 instead of 0 .. L - 1."""
    torch.manual_seed(0)
    model = (
        make_model(13, 13, **FOUR_HEADS, dropout=0.0, position=position)
        .double()
        .eval()
    )
    scheme = attention_positions(model.encoder)[0]
    assert isinstance(scheme, RelativePosition)
    src, _ = padded_src_tgt()
    mask = padding_mask(src, 0)
    expected = model.encode(src, mask)
    for layer in model.encoder.layers:
        layer.self_attn.position = Shifted(layer.self_attn.position, 50)
    torch.testing.assert_close(model.encode(src, mask), expected)


class Shifted(RelativePosition):
    """A scheme whose positions all start ``shift`` later."""

    def __init__(self, scheme: RelativePosition, shift: int) -> None:
        super().__init__()
        self.scheme, self.shift = scheme, shift

    def rotate(self, x, positions):
        return self.scheme.rotate(x, positions + self.shift)

    def bias(self, query, query_positions, key_positions):
        return self.scheme.bias(
            query, query_positions + self.shift, key_positions + self.shift
        )
