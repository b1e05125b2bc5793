"""Where positions enter the model (chapter 9): ``TransformerConfig``'s
``position`` builds each scheme in the right place, the plain and fused
paths agree for every scheme, checkpoints keep them, and every scheme
learns the copy task."""

import pytest
import torch

from transformer_lite import (
    POSITIONS,
    MultiHeadAttention,
    RelativePosition,
    Transformer,
    TransformerConfig,
    make_model,
    padding_mask,
    set_attention_kernel,
)
from transformer_lite.attention import KERNELS
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
from transformer_lite.tasks.copy_task import copy_task_batches
from transformer_lite.training import LabelSmoothingLoss, train_step
from transformer_lite.training.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)

SIZES = dict(n_layers=2, d_model=16, d_ff=32, n_heads=4)


def schemes_of(stack) -> list:
    return [layer.self_attn.position for layer in stack.layers]


def test_default_is_the_papers_sinusoidal_table_and_nothing_else():
    model = make_model(11, 11, **SIZES)
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
    model = make_model(11, 11, **SIZES, position=position)
    kind = ABSOLUTE.get(position, NoPositionalEncoding)
    assert type(model.positional) is kind
    encoder, decoder = schemes_of(model.encoder), schemes_of(model.decoder)
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


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_config_counts_every_schemes_parameters(position, tie_embeddings):
    config = TransformerConfig(
        13,
        13,
        **SIZES,
        max_len=40,
        position=position,
        tie_embeddings=tie_embeddings,
    )
    model = Transformer(config)
    assert config.n_parameters() == model.count_parameters()


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


def test_learned_positions_start_at_the_offset():
    learned = LearnedPositionalEmbedding(6, dropout=0.0, max_len=10)
    x = torch.randn(2, 3, 6)
    expected = x + learned.embedding.weight[4:7]
    torch.testing.assert_close(learned(x, offset=4), expected)
    with pytest.raises(ValueError, match=r"length 11 .*max_len=10"):
        learned(x, offset=8)
    nothing = NoPositionalEncoding(6, dropout=0.0, max_len=10)
    assert torch.equal(nothing(x, offset=7), x)


def inputs(V=13):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, V, (3, 7), generator=g)
    src[0, 4:] = 0
    tgt = torch.randint(3, V, (3, 6), generator=g)
    tgt[1, 3:] = 0
    return src, tgt


@pytest.mark.parametrize("position", POSITIONS)
def test_every_kernel_gives_the_plain_model(position):
    """Forward and gradients of the fused and chunked kernels against
    the plain one, in training mode without dropout, with padding in
    source and target."""
    torch.manual_seed(0)
    model = make_model(
        13, 13, **SIZES, dropout=0.0, position=position
    ).double()
    src, tgt = inputs()
    results = []
    for kernel in KERNELS:  # plain first
        assert set_attention_kernel(model, kernel) > 0
        model.zero_grad()
        out = model(src, tgt)
        out.pow(2).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((out, grads))
    (plain, plain_grads), *others = results
    for out, grads in others:
        torch.testing.assert_close(out, plain, rtol=1e-10, atol=1e-10)
        for a, b in zip(grads, plain_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("position", ["learned", "t5", "shaw"])
def test_checkpoints_keep_the_scheme(position, tmp_path):
    torch.manual_seed(0)
    model = make_model(13, 13, **SIZES, max_len=20, position=position)
    for p in model.parameters():  # every table away from its start
        torch.nn.init.normal_(p)
    path = tmp_path / "model.pt"
    save_checkpoint(path, model)
    loaded, _ = load_checkpoint(path)
    assert loaded.config.position == position
    src, tgt = inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.eval()(src, tgt), model.eval()(src, tgt)
        )
    if position == "t5":  # still one table per stack after loading
        scheme = schemes_of(loaded.encoder)
        assert scheme[0] is scheme[1]


@pytest.mark.parametrize("position", POSITIONS)
def test_every_scheme_learns_the_copy_task(position, one_thread):
    """A few steps on the copy task: the loss falls and stays finite."""
    torch.manual_seed(0)
    V = 10
    model = make_model(V, V, **SIZES, dropout=0.0, position=position)
    loss_fn = LabelSmoothingLoss(V, 0, 0.0, reduction="sum")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = copy_task_batches(40, 32, 6, V, 1, min_len=2)
    losses = [train_step(model, [b], loss_fn, optimizer) for b in batches]
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
        make_model(13, 13, **SIZES, dropout=0.0, position=position)
        .double()
        .eval()
    )
    scheme = schemes_of(model.encoder)[0]
    assert isinstance(scheme, RelativePosition)
    src, _ = inputs()
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
