"""Tests for transformer_lite.domains.tabular (chapter 14): the feature
tokens against their formula, a table as a set of features (permuting
the columns with their weights changes nothing), the [CLS] token's
attention, gradients, and every refusal."""

import pytest
import torch
from torch.func import functional_call

from transformer_lite import seed_everything
from transformer_lite.domains.tabular import (
    FeatureTokenizer,
    FTTransformer,
    check_table,
)

SIZES = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)
CATEGORIES = (2, 4)


def tiny_ft(n_numeric=3, categories=CATEGORIES, seed=0, **fields):
    """A float64 FT-Transformer of SIZES, in eval mode."""
    seed_everything(seed)
    model = FTTransformer(n_numeric, categories, **{**SIZES, **fields})
    return model.double().eval()


def table(B=5, n_numeric=3, categories=CATEGORIES, seed=0):
    """(B, n_numeric) float64 numbers and (B, n_cat) valid codes."""
    g = torch.Generator().manual_seed(seed)
    numeric = torch.randn(B, n_numeric, generator=g, dtype=torch.float64)
    codes = [torch.randint(s, (B, 1), generator=g) for s in categories]
    categorical = torch.cat(codes, dim=1) if codes else None
    return numeric, categorical


def test_shapes_of_the_output_the_features_and_the_cls_attention():
    model = tiny_ft()
    x, c = table()
    assert model(x, c).shape == (5, 1)
    assert model.features(x, c).shape == (5, 3 + 2 + 1, 16)
    attention = model.cls_attention(x, c)
    assert attention.shape == (2, 5, 2, 6)  # (n_layers, B, H, F + 1)
    ones = torch.ones(2, 5, 2, dtype=torch.float64)
    torch.testing.assert_close(attention.sum(-1), ones)
    assert tiny_ft(n_outputs=3)(x, c).shape == (5, 3)


def test_numeric_only_and_categorical_only_tables():
    x, _ = table(n_numeric=4, categories=())
    assert tiny_ft(4, ())(x).shape == (5, 1)
    _, c = table(n_numeric=0)
    assert tiny_ft(0, CATEGORIES)(None, c).shape == (5, 1)


def test_tokens_follow_the_formula_and_the_cls_token_is_last():
    """T_j = x_j W_j + b_j for a numeric feature, E_j[c_j] + b_j for a
    categorical one, then the [CLS] token."""
    seed_everything(0)
    tok = FeatureTokenizer(3, CATEGORIES, 8).double()
    x, c = table()
    tokens = tok(x, c)  # (B, 6, C)
    for b in range(5):
        for j in range(3):
            expected = x[b, j] * tok.weight[j] + tok.bias[j]
            torch.testing.assert_close(tokens[b, j], expected)
        for j, start in enumerate((0, 2)):  # feature j's rows in the table
            row = tok.embedding.weight[start + c[b, j]]
            expected = row + tok.category_bias[j]
            torch.testing.assert_close(tokens[b, 3 + j], expected)
        torch.testing.assert_close(tokens[b, -1], tok.cls)
    assert tok.n_tokens == 6


def test_each_token_reads_only_its_own_feature():
    seed_everything(0)
    tok = FeatureTokenizer(3, CATEGORIES, 8).double()
    x, c = table()
    before = tok(x, c)
    x2, c2 = x.clone(), c.clone()
    x2[:, 1] += 1.0
    c2[:, 1] = (c2[:, 1] + 1) % CATEGORIES[1]
    after = tok(x2, c2)
    changed = (after != before).any(dim=-1).any(dim=0)  # (6,)
    assert changed.tolist() == [False, True, False, False, True, False]


def test_permuting_the_features_with_their_weights_changes_nothing():
    """No positions: the encoder sees a set of feature tokens. Permute
    the numeric columns and the tokenizer's weight rows the same way:
    the tokens are permuted, the [CLS] output and the prediction are
    not (float64, no dropout; the sums over keys run in another order,
    hence a tolerance of a few units in the last place)."""
    model = tiny_ft(n_numeric=5, categories=(3,))
    x, c = table(n_numeric=5, categories=(3,))
    perm = torch.tensor([3, 0, 4, 1, 2])
    before_tokens = model.tokenizer(x, c)
    before_features = model.features(x, c)
    before = model(x, c)
    with torch.no_grad():
        model.tokenizer.weight.copy_(model.tokenizer.weight[perm])
        model.tokenizer.bias.copy_(model.tokenizer.bias[perm])
    x = x[:, perm]
    torch.testing.assert_close(
        model.tokenizer(x, c)[:, :5], before_tokens[:, perm], rtol=0, atol=0
    )
    tight = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        model.features(x, c)[:, -1], before_features[:, -1], **tight
    )
    torch.testing.assert_close(model(x, c), before, **tight)


def test_permuting_the_features_alone_changes_the_prediction():
    """The test above can fail: the columns moved without their weights
    are other features to the model."""
    model = tiny_ft(n_numeric=5, categories=(3,))
    x, c = table(n_numeric=5, categories=(3,))
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert not torch.allclose(model(x[:, perm], c), model(x, c))


def test_pre_ln_removes_the_first_layers_first_norm_as_the_paper():
    model = tiny_ft()
    assert isinstance(model.encoder.layers[0].norm1, torch.nn.Identity)
    assert isinstance(model.encoder.layers[1].norm1, torch.nn.LayerNorm)
    kept = tiny_ft(first_norm=True)
    assert isinstance(kept.encoder.layers[0].norm1, torch.nn.LayerNorm)
    post = tiny_ft(norm_first=False)
    assert isinstance(post.encoder.layers[0].norm1, torch.nn.LayerNorm)
    assert post.encoder.norm is None


def test_the_head_reads_the_normalised_cls_token():
    """y = Linear(ReLU(LayerNorm(T_cls))): the encoder's final LayerNorm
    (pre-LN), then the head, at the last token."""
    model = tiny_ft()
    x, c = table()
    cls = model.features(x, c)[:, -1]  # (B, C)
    torch.testing.assert_close(
        cls.mean(-1), torch.zeros(5).double(), atol=1e-12, rtol=0
    )
    linear = model.head[1]
    expected = torch.relu(cls) @ linear.weight.T + linear.bias
    torch.testing.assert_close(model(x, c), expected)


def test_cls_attention_leaves_the_model_as_it_was():
    model = tiny_ft().train()
    x, c = table()
    model.cls_attention(x, c)
    assert model.training
    for layer in model.encoder.layers:
        assert not layer.self_attn.keep_weights
        assert layer.self_attn.weights is None


def test_gradients_match_finite_differences():
    """gradcheck on a tiny float64 model, through the numbers and the
    numeric feature weights."""
    model = tiny_ft(
        n_numeric=2, categories=(3,), d_model=4, n_layers=1, d_ff=8
    )
    x, c = table(B=3, n_numeric=2, categories=(3,))
    w = model.tokenizer.weight.detach().clone()

    def predict(numeric, weight):
        params = {"tokenizer.weight": weight}
        return functional_call(model, params, (numeric, c))

    x.requires_grad_(True)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(predict, (x, w))


def test_a_tiny_model_learns_a_rule_on_one_feature(one_thread):
    """The label is the sign of feature 1 when the category is 0, of
    feature 0 otherwise: a rule across a category and two columns."""
    seed_everything(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 3, generator=g)
    c = torch.randint(2, (128, 1), generator=g)
    y = torch.where(c[:, 0] == 0, x[:, 1] > 0, x[:, 0] > 0).float()
    model = FTTransformer(3, (2,), **SIZES)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(150):
        opt.zero_grad()
        loss = loss_fn(model(x, c)[:, 0], y)
        loss.backward()
        opt.step()
    accuracy = ((model(x, c)[:, 0] > 0).float() == y).float().mean()
    assert accuracy > 0.9, float(accuracy)


def test_float32_numbers_are_read_by_a_float64_model():
    model = tiny_ft()
    x, c = table()
    torch.testing.assert_close(
        model(x.float(), c), model(x, c), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    "numeric, categorical, match",
    [
        (torch.randn(5, 4), "ok", r"numeric must have shape \(B, 3\)"),
        (torch.randn(5), "ok", r"numeric must have shape \(B, 3\)"),
        (
            torch.ones(5, 3, dtype=torch.long),
            "ok",
            "numeric must hold floating-point numbers, got dtype torch.int64",
        ),
        ([[1.0, 2.0, 3.0]], "ok", "numeric must be a .* tensor .*list"),
        (None, "ok", "numeric is missing: this model reads 3"),
        ("ok", None, "categorical is missing: this model reads 2"),
        (
            "ok",
            torch.zeros(5, 3, dtype=torch.long),
            r"categorical must have shape \(B, 2\)",
        ),
        ("ok", torch.zeros(5, 2), "categorical must hold integer category"),
        (
            "ok",
            torch.zeros(4, 2, dtype=torch.long),
            "the same B, got 5 and 4 rows",
        ),
    ],
)
def test_wrong_shapes_and_dtypes_are_refused(numeric, categorical, match):
    model = tiny_ft()
    x, c = table()
    numeric = x if isinstance(numeric, str) else numeric
    categorical = c if isinstance(categorical, str) else categorical
    with pytest.raises(ValueError, match=match):
        model(numeric, categorical)


def test_nan_and_infinity_are_refused_with_their_place():
    model = tiny_ft()
    x, c = table()
    x[2, 1] = float("nan")
    with pytest.raises(
        ValueError,
        match="numeric holds nan at row 2, "
        "feature 1: every value must be a finite number",
    ):
        model(x, c)
    x[2, 1] = float("inf")
    with pytest.raises(ValueError, match="holds inf at row 2, feature 1"):
        model(x, c)


@pytest.mark.parametrize("code", [4, -1])
def test_category_codes_out_of_range_are_refused(code):
    model = tiny_ft()
    x, c = table()
    c[3, 1] = code
    with pytest.raises(
        ValueError,
        match=(
            rf"categorical feature 1 holds the code {code} at row 3, outside "
            r"its 4 categories \[0, 3\]"
        ),
    ):
        model(x, c)


def test_check_table_reads_no_values_when_told_not_to():
    x, c = table()
    x[0, 0] = float("nan")
    c[0, 0] = 9
    assert check_table(x, c, 3, CATEGORIES, values=False) == 5
    with pytest.raises(ValueError, match="finite"):
        check_table(x, c, 3, CATEGORIES)


@pytest.mark.parametrize(
    "args, fields, match",
    [
        ((0, ()), {}, "at least one feature"),
        ((3, (2, 0)), {}, r"categories\[1\] must be a positive int"),
        ((-1, ()), {}, "n_numeric must be a non-negative int"),
        ((3, ()), dict(n_heads=3), "divisible by n_heads"),
        ((3, ()), dict(n_outputs=0), "n_outputs must be a positive int"),
        ((3, ()), dict(dropout=1.0), "dropout must be a finite number"),
        ((3, ()), dict(first_norm=1), "first_norm must be True or False"),
    ],
)
def test_bad_options_are_refused(args, fields, match):
    with pytest.raises(ValueError, match=match):
        FTTransformer(*args, **{**SIZES, **fields})
