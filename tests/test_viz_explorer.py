"""collect_attention, kept_weights and attention_explorer (viz,
chapters 7 and 10)."""

import pytest
import torch

from transformer_lite import make_model
from transformer_lite.viz import (
    ATTENTION_KINDS,
    attention_explorer,
    collect_attention,
    kept_weights,
)

pytest.importorskip("altair")


def model_and_batch():
    torch.manual_seed(0)
    model = make_model(10, 9, n_layers=2, d_model=16, d_ff=32, n_heads=2)
    src = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0]])  # (B, S)
    tgt = torch.tensor([[1, 3, 4, 5], [1, 6, 0, 0]])  # (B, T)
    return model, src, tgt


def test_collect_attention_shapes_and_flags():
    model, src, tgt = model_and_batch()
    model.train()
    weights = collect_attention(model, src, tgt)
    assert [w.shape for w in weights["encoder"]] == [(2, 2, 5, 5)] * 2
    assert [w.shape for w in weights["decoder"]] == [(2, 2, 4, 4)] * 2
    assert [w.shape for w in weights["cross"]] == [(2, 2, 4, 5)] * 2
    rows = weights["cross"][1][1, :, :2].sum(-1)  # real queries of row 1
    torch.testing.assert_close(rows, torch.ones_like(rows))
    assert (weights["cross"][0][1, :, :, 3:] == 0).all()  # padding keys
    assert model.training  # mode restored, flags off again
    attn = model.decoder.layers[0].cross_attn
    assert not attn.keep_weights and attn.weights is None


def test_explorer_data_menus_and_filters():
    model, src, tgt = model_and_batch()
    weights = collect_attention(model, src, tgt)
    sources = [list("<abc>"), list("<d>")]
    targets = [list("<xyz"), list("<w")]
    chart = attention_explorer(weights, sources, targets, ["one", "two"])
    frame = chart.data
    L, H = 2, 2
    enc = 25 + 9  # S_b * S_b
    dec = 10 + 3  # T_b (T_b + 1) / 2: the future is left out
    cross = 20 + 6  # T_b * S_b
    assert len(frame) == L * H * (enc + dec + cross)
    assert set(frame["attention"]) == set(ATTENTION_KINDS.values())
    sums = frame.groupby(["example", "attention", "layer", "head", "q"])
    assert sums["weight"].sum().between(0.998, 1.002).all()  # each row
    pick = frame[
        (frame["example"] == "one")
        & (frame["layer"] == 1)
        & (frame["head"] == 1)
        & (frame["query"] == "2:y")
    ]
    cross_row = pick[pick["attention"] == "cross-attention"]
    assert cross_row["key"].tolist() == ["0:<", "1:a", "2:b", "3:c", "4:>"]
    assert cross_row["weight"].tolist() == pytest.approx(
        weights["cross"][1][0, 1, 2].tolist(), abs=1e-4
    )
    spec = chart.to_dict()
    binds = {p["name"]: p["bind"] for p in spec["params"]}
    assert set(binds) == {
        "pick_example",
        "pick_attention",
        "pick_layer",
        "pick_head",
    }
    assert binds["pick_example"]["options"] == ["one", "two"]
    filters = [t["filter"] for t in spec["transform"]]
    assert len(filters) == 4


def test_explorer_refuses_too_much_data():
    model, src, tgt = model_and_batch()
    weights = collect_attention(model, src, tgt)
    sources, targets = [list("<abc>"), list("<d>")], [list("<xyz"), list("<w")]
    with pytest.raises(ValueError, match="max_rows"):
        attention_explorer(weights, sources, targets, max_rows=100)
    with pytest.raises(ValueError, match="distinct name"):
        attention_explorer(weights, sources, targets, ["same", "same"])


def test_decoder_rows_can_be_labelled_by_the_predicted_token():
    model, src, tgt = model_and_batch()
    weights = collect_attention(model, src, tgt)
    sources, targets = [list("<abc>"), list("<d>")], [list("<xyz"), list("<w")]
    predicted = [list("xyz>"), list("w>")]
    chart = attention_explorer(weights, sources, targets, predicted=predicted)
    frame = chart.data
    decoder = frame[frame["attention"] == "decoder self-attention"]
    first = decoder[decoder["example"] == "<abc>"]
    assert sorted(set(first["query"])) == ["0:x", "1:y", "2:z", "3:>"]
    assert sorted(set(first["key"])) == ["0:<", "1:x", "2:y", "3:z"]
    cross = frame[frame["attention"] == "cross-attention"]
    assert "3:>" in set(cross["query"]) and "3:c" in set(cross["key"])
    with pytest.raises(ValueError, match="predicted label"):
        attention_explorer(weights, sources, targets, predicted=[["x"], []])


def test_a_decoder_only_model_gets_one_kind_of_attention():
    """kept_weights on a language model's blocks: one kind, "decoder";
    the explorer offers it alone and shows it first."""
    from transformer_lite.lm import make_lm

    torch.manual_seed(0)
    lm = make_lm(12, n_layers=2, d_model=16, d_ff=32, n_heads=2).train()
    tokens = torch.tensor([[4, 5, 6, 7]])  # (B, L)
    blocks = {"decoder": [layer.self_attn for layer in lm.layers]}
    weights = kept_weights(lm, blocks, tokens)
    assert [w.shape for w in weights["decoder"]] == [(1, 2, 4, 4)] * 2
    assert lm.training and not lm.layers[0].self_attn.keep_weights
    labels = [list("abcd")]
    chart = attention_explorer(weights, labels, labels, ["sample"])
    assert set(chart.data["attention"]) == {"decoder self-attention"}
    menu = {p["name"]: p for p in chart.to_dict()["params"]}
    attention = menu["pick_attention"]
    assert attention["bind"]["options"] == ["decoder self-attention"]
    assert attention["value"] == "decoder self-attention"
