"""heads_chart: one heatmap per head (viz, chapter 3)."""

import pytest
import torch

from transformer_lite.viz import heads_chart

pytest.importorskip("altair")


def test_heads_chart_has_one_row_per_head_query_key():
    weights = torch.rand(3, 4, 5).softmax(dim=-1)  # (H, Lq, Lk)
    chart = heads_chart(weights, list("abcd"), list("vwxyz"))
    frame = chart.data
    assert len(frame) == 3 * 4 * 5
    assert sorted(frame["head"].unique()) == ["head 0", "head 1", "head 2"]
    row = frame[(frame["head"] == "head 2") & (frame["query"] == "1:b")]
    row = row[row["key"] == "4:z"]
    assert float(row["weight"].iloc[0]) == pytest.approx(
        float(weights[2, 1, 4])
    )
    chart.to_dict()  # a valid Vega-Lite spec


def test_heads_chart_names_and_errors():
    weights = torch.rand(2, 3, 3)
    chart = heads_chart(weights, head_names=["left", "right"])
    assert list(chart.data["head"].unique()) == ["left", "right"]
    with pytest.raises(ValueError, match=r"\(H, Lq, Lk\)"):
        heads_chart(weights[0])
    with pytest.raises(ValueError, match="head names"):
        heads_chart(weights, head_names=["only one"])
    with pytest.raises(ValueError, match="labels"):
        heads_chart(weights, queries=["a"])


def test_four_heads_fit_the_book_column():
    """The book's text column is about 700 px wide: four panels, their
    axes and the legend must fit in it."""
    spec = heads_chart(torch.rand(4, 3, 3)).to_dict()
    assert 4 * spec["spec"]["width"] <= 500
