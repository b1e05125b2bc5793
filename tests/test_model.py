"""The full model: sizes from the paper, causality, padding, errors, the
parameters its config counts, and every attention kernel giving the
plain kernel's outputs and gradients with every position scheme."""

import pytest
import torch
from conftest import padded_src_tgt, tiny_model

from transformer_lite.attention import KERNELS, set_attention_kernel
from transformer_lite.model import Transformer, TransformerConfig, make_model
from transformer_lite.schemes import POSITIONS

PAD = 0
SMALL = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4)  # no dropout
FOUR_HEADS = dict(n_layers=2, d_model=16, d_ff=32, n_heads=4)


def test_base_model_has_about_the_papers_65m_parameters():
    """Shared 37,000-token vocabulary, tied embeddings (paper, Table 3)."""
    with torch.device("meta"):
        model = make_model(37000, 37000, tie_embeddings=True)
    n = model.count_parameters()
    # 6 x 3,152,384 (encoder) + 6 x 4,204,032 (decoder)
    # + 37,000 x 512 (one embedding matrix) + 37,000 (output bias)
    assert n == 6 * 3_152_384 + 6 * 4_204_032 + 37_000 * 512 + 37_000
    assert abs(n - 65e6) / 65e6 < 0.05


def test_tied_embeddings_share_one_tensor():
    model = make_model(
        20, 20, n_layers=1, d_model=16, d_ff=32, n_heads=2, tie_embeddings=True
    )
    assert model.src_embed.weight is model.tgt_embed.weight
    assert model.generator.weight is model.src_embed.weight
    untied = make_model(20, 20, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    assert untied.count_parameters() - model.count_parameters() == 2 * 20 * 16


def test_forward_shapes(device):
    model = tiny_model(13, 11, **SMALL, device=device)
    src = torch.randint(1, 13, (3, 7), device=device)
    tgt = torch.randint(1, 11, (3, 5), device=device)
    assert model(src, tgt).shape == (3, 5, 11)
    assert model.encode(src).shape == (3, 7, 32)


def test_changing_a_later_target_token_changes_no_earlier_output():
    model = tiny_model(13, 11, **SMALL).eval()
    src = torch.randint(1, 13, (2, 6))
    tgt = torch.randint(1, 11, (2, 5))
    out = model(src, tgt)
    for j in range(1, 5):
        changed = tgt.clone()
        changed[:, j] = (changed[:, j] % 10) + 1
        out2 = model(src, changed)
        torch.testing.assert_close(out[:, :j], out2[:, :j])
        assert not torch.allclose(out[:, j:], out2[:, j:])


def test_padded_tokens_change_no_real_output():
    model = tiny_model(13, 11, **SMALL).eval()
    src = torch.tensor([[5, 6, 7, PAD, PAD], [5, 6, 7, 8, 9]])
    tgt = torch.tensor([[1, 2, 3, PAD], [1, 2, 3, 4]])
    out = model(src, tgt)
    # Change the embeddings seen at padded positions: give the pad id a new
    # vector. Only padded positions may change.
    with torch.no_grad():
        model.src_embed.weight[PAD] += 3.0
        model.tgt_embed.weight[PAD] += 3.0
    out2 = model(src, tgt)
    real = tgt != PAD
    torch.testing.assert_close(out[real], out2[real])
    assert not torch.allclose(out[~real], out2[~real])


def test_dropout_zero_means_no_dropout_anywhere():
    model = tiny_model(13, 11, **SMALL, dropout=0.0)
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 11, (2, 4))
    train_out = model.train()(src, tgt)
    eval_out = model.eval()(src, tgt)
    torch.testing.assert_close(train_out, eval_out, rtol=0, atol=0)
    noisy = tiny_model(13, 11, **SMALL, dropout=0.3)
    assert not torch.allclose(noisy.train()(src, tgt), noisy.eval()(src, tgt))


def test_small_model_overfits_one_batch():
    torch.manual_seed(0)
    model = make_model(
        12, 12, n_layers=1, d_model=32, d_ff=64, n_heads=4, dropout=0.0
    )
    src = torch.randint(1, 12, (4, 8))
    tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), src], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(150):
        logits = model(src, tgt[:, :-1])
        loss = loss_fn(logits.reshape(-1, 12), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    assert torch.equal(model(src, tgt[:, :-1]).argmax(-1), tgt[:, 1:])


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_model=30, n_heads=4), r"d_model \(30\).*n_heads \(4\)"),
        (dict(pad_id=13), r"pad_id 13 .*src_vocab=13"),
        (dict(pad_id=-1), "pad_id -1"),
        (dict(tie_embeddings=True), "one shared vocabulary"),
        (dict(dropout=1.5), "dropout"),
        (dict(n_layers=0), "n_layers"),
    ],
)
def test_bad_configurations_are_clear_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(13, 11, **fields)


def test_bad_tokens_are_clear_errors():
    """Shapes and dtypes always; id ranges with the opt-in check (it
    reads values, which the forward pass must not do by default)."""
    model = tiny_model(13, 11, **SMALL)
    model.check_ids = True
    src = torch.randint(1, 13, (2, 5))
    tgt = torch.randint(1, 11, (2, 4))
    with pytest.raises(
        ValueError,
        match=r"src holds token ids in \[.*13\]"
        r".*\[0, 12\]",
    ):
        model(torch.full((2, 5), 13), tgt)
    with pytest.raises(ValueError, match=r"tgt .*\[-1, .*\[0, 10\]"):
        model(src, torch.full((2, 4), -1))
    with pytest.raises(ValueError, match="integer token ids"):
        model(src.float(), tgt)
    with pytest.raises(ValueError, match="batch size"):
        model(src, tgt[:1])
    with pytest.raises(ValueError, match="max_len"):
        Transformer(
            TransformerConfig(
                13, 11, n_layers=1, d_model=8, d_ff=8, n_heads=2, max_len=4
            )
        )(src, tgt)


def test_embeddings_are_scaled_by_sqrt_d_model_and_positioned():
    model = tiny_model(13, 11, **SMALL)
    tokens = torch.tensor([[3, 4, 5]])
    table = model.positional.table[:3]
    expected = model.src_embed(tokens) * 32**0.5 + table
    torch.testing.assert_close(model.embed(tokens, model.src_embed), expected)


@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(norm_first=True),
        dict(tie_embeddings=True),
        dict(n_layers=3, d_ff=24, norm_first=True, tie_embeddings=True),
    ],
)
def test_config_counts_parameters_without_building(fields):
    """n_parameters() is what the checkpoint loader checks against its
    limit before it allocates anything."""
    sizes = dict(n_layers=2, d_model=8, d_ff=16, n_heads=2) | fields
    config = TransformerConfig(13, 13, **sizes)
    assert config.n_parameters() == Transformer(config).count_parameters()


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_config_counts_every_schemes_parameters(position, tie_embeddings):
    config = TransformerConfig(
        13,
        13,
        **FOUR_HEADS,
        max_len=40,
        position=position,
        tie_embeddings=tie_embeddings,
    )
    model = Transformer(config)
    assert config.n_parameters() == model.count_parameters()


@pytest.mark.parametrize("position", POSITIONS)
def test_every_kernel_gives_the_plain_model(position):
    """Forward and gradients of the fused and chunked kernels against
    the plain one, in training mode without dropout, with padding in
    source and target."""
    torch.manual_seed(0)
    model = make_model(
        13, 13, **FOUR_HEADS, dropout=0.0, position=position
    ).double()
    src, tgt = padded_src_tgt()
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


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.int16, torch.bool]
)
def test_token_dtypes_the_embedding_cannot_take_are_refused(dtype):
    # Before: uint8, int8 and int16 passed the check and then failed in
    # nn.Embedding with a RuntimeError.
    model = tiny_model(13, 11, **SMALL)
    src = torch.randint(1, 11, (2, 5))
    with pytest.raises(ValueError, match=f"got dtype {dtype}"):
        model(src.to(dtype), src)
    model(src.to(torch.int32), src)  # int32 is what the embedding takes
