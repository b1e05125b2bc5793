"""The encoder-only model: shapes, padding invariance, token types, the
pooler on the first position, tied weights and the parameter count,
its start, the classifier sharing the encoder, a few steps of ``fit``
lowering the masked-LM loss, and bad configs and inputs refused."""

import pytest
import torch
from torch import nn

from transformer_lite.attention import KERNELS
from transformer_lite.device import seed_everything
from transformer_lite.lm import (
    IGNORE_INDEX,
    EncoderClassifier,
    EncoderConfig,
    EncoderModel,
    make_encoder,
    mask_tokens,
)
from transformer_lite.training import Examples, TrainOptions, fit
from transformer_lite.training.objectives import supervised_loss

V, PAD, MASK = 23, 0, 3
SIZES = dict(n_layers=2, d_model=16, d_ff=40, n_heads=4, max_len=32)


def tiny_encoder(seed: int = 0, **fields) -> EncoderModel:
    """Two post-LN layers of width 16, in float64 and eval mode."""
    seed_everything(seed)
    return make_encoder(V, **{**SIZES, **fields}).double().eval()


def tokens(B: int = 3, L: int = 9, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (B, L), generator=g)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_shapes():
    model = tiny_encoder()
    x = tokens(3, 9)
    assert model(x).shape == (3, 9, V)
    assert model.hidden_states(x).shape == (3, 9, 16)
    assert model.pooled(x).shape == (3, 16)
    outputs = model.layer_outputs(x)
    assert [tuple(o.shape) for o in outputs] == [(3, 9, 16)] * 3
    close(outputs[-1], model.hidden_states(x))
    assert EncoderClassifier(model, 5)(x).shape == (3, 5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_padded_row_computes_what_it_computes_unpadded(kernel):
    model = tiny_encoder(kernel=kernel, type_vocab=2)
    x = tokens(2, 9)
    types = torch.zeros_like(x)
    types[:, 4:] = 1
    padded = x.clone()
    padded[0, 6:] = PAD
    alone = model(x[:1, :6], types[:1, :6])
    close(model(padded, types)[0, :6], alone[0])
    close(
        model.pooled(padded, types)[0],
        model.pooled(x[:1, :6], types[:1, :6])[0],
    )
    close(model(padded, types)[1], model(x, types)[1])  # other rows alone


def test_padding_is_masked_where_pad_id_says():
    model = tiny_encoder(pad_id=5)
    x = tokens(1, 8)
    x[0, 2] = 0  # id 0 is a token like any other here
    x[x == 5] = 6
    padded = x.clone()
    padded[0, 6:] = 5
    mask = model.padding_mask(padded)
    assert mask.tolist() == [[[True] * 6 + [False] * 2]]
    close(model(padded)[0, :6], model(x[:, :6])[0])
    assert not torch.allclose(model(x)[0, :6], model(x[:, :6])[0])


def test_every_position_sees_every_other():
    """No causal mask: changing the last token changes the first output."""
    model = tiny_encoder()
    x = tokens(1, 7)
    y = x.clone()
    y[0, -1] = 4 if x[0, -1] != 4 else 5
    assert not torch.allclose(model(x)[0, 0], model(y)[0, 0])


def test_token_types_enter_and_default_to_type_zero():
    model = tiny_encoder(type_vocab=2)
    x = tokens()
    zeros, ones = torch.zeros_like(x), torch.ones_like(x)
    close(model(x), model(x, zeros))
    assert not torch.allclose(model(x), model(x, ones))
    type_vector = model.embedding.token_type.weight[1]
    assert type_vector.abs().sum() > 0


def test_the_input_is_token_plus_type_plus_position_normalised():
    model = tiny_encoder(type_vocab=3)
    x = tokens(2, 5)
    types = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 1, 0, 0]])
    e = model.embedding
    total = e.token(x) + e.token_type(types) + e.position.weight[:5]
    close(e(x, types), e.norm(total))
    assert e.norm.eps == 1e-12


def test_dropout_comes_after_the_layer_norm():
    """BERT's order: a dropped element of the input is exactly zero (a
    LayerNorm after the dropout would move it)."""
    model = tiny_encoder(dropout=0.5).train()
    e, x = model.embedding, tokens(4, 9)
    out = e(x, None)  # (B, L, C)
    dropped = out == 0
    assert 0.4 < float(dropped.double().mean()) < 0.6
    normed = e.norm(e.token(x) + e.position.weight[:9])
    close(out[~dropped], 2 * normed[~dropped])  # kept, times 1 / (1 - p)


def test_the_pooler_reads_the_first_position():
    model = tiny_encoder()
    x = tokens()
    hidden = model.hidden_states(x)
    dense = model.pooler.dense
    close(model.pooled(x), torch.tanh(hidden[:, 0] @ dense.weight.T
                                      + dense.bias))  # fmt: skip


def test_the_layers_are_post_ln_with_gelu():
    model = tiny_encoder()
    for layer in model.encoder.layers:
        assert not layer.norm_first
        assert isinstance(layer.feed_forward.activation, nn.GELU)
        assert layer.norm1.eps == layer.norm2.eps == 1e-12
    assert model.encoder.norm is None
    head = model.mlm_head
    assert isinstance(head.activation, nn.GELU)
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    expected = head.output(head.norm(nn.functional.gelu(head.dense(x))))
    close(head(x), expected)


def expected_parameters(type_vocab: int, tied: bool) -> int:
    C, F, N, L = 16, 40, 2, 32
    embeddings = V * C + L * C + type_vocab * C + 2 * C
    layer = 4 * (C * C + C) + (C * F + F) + (F * C + C) + 2 * 2 * C
    head = (C * C + C) + 2 * C + V + (0 if tied else V * C)
    pooler = C * C + C
    return embeddings + N * layer + head + pooler


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("type_vocab", [0, 2])
def test_tied_weights_and_the_parameter_count(tied, type_vocab):
    model = tiny_encoder(tie_embeddings=tied, type_vocab=type_vocab)
    output, table = model.mlm_head.output, model.embedding.token
    assert (output.weight is table.weight) == tied
    assert output.bias.shape == (V,)  # the output layer's own bias
    expected = expected_parameters(type_vocab, tied)
    assert model.count_parameters() == expected
    if tied:  # a gradient through the output reaches the embedding
        model(tokens()).sum().backward()
        assert table.weight.grad is not None


def test_without_heads():
    model = tiny_encoder(mlm_head=False, pooler=False)
    assert model.mlm_head is None and model.pooler is None
    x = tokens()
    assert model.hidden_states(x).shape == (3, 9, 16)
    with pytest.raises(ValueError, match="no masked-LM head"):
        model(x)
    with pytest.raises(ValueError, match="no pooler"):
        model.pooled(x)
    with pytest.raises(ValueError, match="no pooler"):
        EncoderClassifier(model, 2)


def test_the_start_glorot_and_the_tables():
    model = make_encoder(V, **SIZES)
    C = 16
    for name, p in model.named_parameters():
        p = p.detach()
        if name.startswith("embedding.") and p.dim() == 2:
            std = float(p.std())
            assert 0.7 * C**-0.5 < std < 1.3 * C**-0.5, name
        elif p.dim() == 2:
            bound = (6 / sum(p.shape)) ** 0.5
            assert float(p.abs().max()) <= bound, name
            assert float(p.abs().max()) > 0.8 * bound, name
        elif name.endswith("bias"):
            assert not p.any(), name
        else:  # LayerNorm weights
            assert (p == 1).all(), name
    seed_everything(0)
    a = make_encoder(V, **SIZES)
    seed_everything(0)
    b = make_encoder(V, **SIZES)
    assert all(
        torch.equal(p, q)
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_the_classifier_shares_the_encoder_and_trains_its_weights():
    model = tiny_encoder()
    classifier = EncoderClassifier(model, 3).train()
    assert classifier.encoder is model
    assert classifier.dropout.p == model.config.dropout
    assert classifier.head.weight.dtype == torch.float64
    assert not classifier.head.bias.any()
    x = tokens()
    classifier.eval()
    close(classifier(x), classifier.head(model.pooled(x)))
    classifier.train()(x).sum().backward()
    layer = model.encoder.layers[0].self_attn.w_q.weight
    assert layer.grad is not None and layer.grad.abs().sum() > 0
    assert model.mlm_head.dense.weight.grad is None  # unused
    assert EncoderClassifier(model, 3, dropout=0.3).dropout.p == 0.3


def test_fit_lowers_the_masked_lm_loss(one_thread):
    seed_everything(0)
    model = make_encoder(V, **SIZES, dropout=0.0)
    x = tokens(8, 12)
    x[:, 0] = 1  # [CLS]
    x[3, 9:] = PAD
    inputs, targets = mask_tokens(x, vocab=V, mask_id=MASK, special_ids=[1],
                                  generator=torch.Generator().manual_seed(0),
                                  p=0.3)  # fmt: skip
    batch = Examples(inputs, targets, ignore_index=IGNORE_INDEX)
    loss_fn = nn.CrossEntropyLoss(reduction="sum", ignore_index=IGNORE_INDEX)
    objective = supervised_loss(loss_fn)
    with torch.no_grad():
        before = float(objective(model.eval(), batch)) / batch.n_tokens
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    history = fit(model, [batch], objective, optimizer, epochs=40,
                  options=TrainOptions(progress=False))  # fmt: skip
    with torch.no_grad():
        after = float(objective(model.eval(), batch)) / batch.n_tokens
    assert after < 0.2 * before, (before, after)
    assert history.train_loss[-1] < history.train_loss[0]


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(vocab=0), "vocab must be a positive int"),
        (dict(n_layers=1.0), "n_layers must be a positive int"),
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(max_len=0), "max_len must be a positive int"),
        (dict(type_vocab=-1), "type_vocab must be a non-negative int"),
        (dict(dropout=1.0), "dropout must be"),
        (dict(pad_id=V), "pad_id 23 is outside the vocabulary"),
        (dict(pad_id=True), "pad_id must be an int"),
        (dict(activation="silu"), "activation must be one of"),
        (dict(norm_eps=0.0), "norm_eps must be positive"),
        (dict(tie_embeddings=1), "tie_embeddings must be True or False"),
        (dict(mlm_head="yes"), "mlm_head must be True or False"),
        (dict(pooler=None), "pooler must be True or False"),
        (dict(inner_dropout="no"), "inner_dropout must be True or False"),
        (dict(kernel="flash"), "kernel must be one of"),
    ],
)
def test_bad_configs_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        EncoderConfig(**{"vocab": V, **fields})


def test_odd_widths_are_accepted():
    """Learned positions need no even width (the sinusoidal table does)."""
    assert make_encoder(V, d_model=15, n_heads=3, d_ff=8, n_layers=1)


@pytest.mark.parametrize(
    "x, types, match",
    [
        (torch.rand(2, 5), None, "integer token ids"),
        (torch.tensor([4, 5]), None, r"\(B, L\)"),
        (torch.zeros(2, 0, dtype=torch.long), None, "empty"),
        (torch.full((1, 33), 4), None, "max_len=32"),
        (torch.tensor([[4, V]]), None, "outside the vocabulary"),
        (torch.tensor([[4, 5]]), torch.tensor([[0, 1]]), "no token types"),
    ],
)
def test_bad_inputs_are_refused(x, types, match):
    with pytest.raises(ValueError, match=match):
        tiny_encoder()(x, types)


@pytest.mark.parametrize(
    "types, match",
    [
        (torch.tensor([[0, 1, 1]]), "shape of tokens"),
        (torch.tensor([[0, 2]]), "outside the vocabulary"),
        (torch.tensor([[0.0, 1.0]]), "integer token ids"),
    ],
)
def test_bad_token_types_are_refused(types, match):
    with pytest.raises(ValueError, match=match):
        tiny_encoder(type_vocab=2)(torch.tensor([[4, 5]]), types)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ((nn.Linear(2, 2), 3), "encoder must be an EncoderModel"),
        ((None, 0), "n_classes must be a positive int"),
        ((None, 2, 1.5), "dropout must be"),
    ],
)
def test_bad_classifiers_are_refused(arguments, match):
    encoder, *rest = arguments
    encoder = tiny_encoder() if encoder is None else encoder
    with pytest.raises(ValueError, match=match):
        EncoderClassifier(encoder, *rest)
