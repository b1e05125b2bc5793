"""Charts for the book: attention weights, masks, tables (all chapters).

Altair charts are interactive (tooltips) and render offline in the book.
Altair and pandas are imported when a chart is drawn, so the package itself
needs only torch.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["attention_chart", "heads_chart", "heatmap", "mask_chart"]


def _labels(labels: Sequence | None, n: int) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"expected {n} labels, got {len(labels)}")
    # Position-prefixed so that repeated tokens stay distinct axis values.
    return [f"{i}:{label}" for i, label in enumerate(labels)]


def heatmap(
    matrix: Tensor,
    *,
    title: str,
    x_title: str,
    y_title: str,
    value_title: str = "value",
    x_labels: Sequence | None = None,
    y_labels: Sequence | None = None,
    size: int = 260,
    scheme: str = "blues",
):
    """An interactive heatmap of a 2-D tensor: rows on y, columns on x.

    Shape:
        matrix: (rows, columns).
    """
    import altair as alt
    import pandas as pd

    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got {tuple(matrix.shape)}")
    values = matrix.detach().float().cpu()
    rows, cols = values.shape
    ys, xs = _labels(y_labels, rows), _labels(x_labels, cols)
    frame = pd.DataFrame(
        [
            {"y": ys[i], "x": xs[j], "value": float(values[i, j])}
            for i in range(rows)
            for j in range(cols)
        ]
    )
    return (
        alt.Chart(frame, title=title)
        .mark_rect()
        .encode(
            x=alt.X("x:N", sort=xs, title=x_title),
            y=alt.Y("y:N", sort=ys, title=y_title),
            color=alt.Color(
                "value:Q", title=value_title, scale=alt.Scale(scheme=scheme)
            ),
            tooltip=[
                alt.Tooltip("y:N", title=y_title),
                alt.Tooltip("x:N", title=x_title),
                alt.Tooltip("value:Q", title=value_title, format=".3f"),
            ],
        )
        .properties(width=size, height=size)
    )


def attention_chart(
    weights: Tensor,
    queries: Sequence | None = None,
    keys: Sequence | None = None,
    title: str = "Attention weights",
):
    """Heatmap of one attention matrix: which key each query attends to.

    Shape:
        weights: (Lq, Lk).
    """
    return heatmap(
        weights,
        title=title,
        x_title="key position",
        y_title="query position",
        value_title="weight",
        x_labels=keys,
        y_labels=queries,
    )


def mask_chart(mask: Tensor, title: str = "Mask (True = may attend)"):
    """Heatmap of a boolean mask: dark = may attend.

    Shape:
        mask: (Lq, Lk) or (1, Lq, Lk).
    """
    if mask.dim() == 3 and mask.size(0) == 1:
        mask = mask[0]
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    return heatmap(
        mask.float(),
        title=title,
        x_title="key position",
        y_title="query position",
        value_title="may attend",
        scheme="greys",
    )


def heads_chart(
    weights: Tensor,
    queries: Sequence | None = None,
    keys: Sequence | None = None,
    *,
    title: str = "Attention weights per head",
    head_names: Sequence[str] | None = None,
    size: int = 150,
):
    """One attention heatmap per head, side by side on one colour scale.

    Args:
        weights: the attention weights of one example, e.g.
            ``attn.weights[0]`` after a forward pass with
            ``attn.keep_weights = True``.
        queries, keys: token labels for the axes (default: positions).
        head_names: a title per panel (default: "head 0", "head 1", ...).

    Shape:
        weights: (H, Lq, Lk).
    """
    import altair as alt
    import pandas as pd

    if weights.dim() != 3:
        raise ValueError(
            f"weights must be (H, Lq, Lk), got {tuple(weights.shape)}"
        )
    values = weights.detach().float().cpu()
    n_heads, rows, cols = values.shape
    ys, xs = _labels(queries, rows), _labels(keys, cols)
    if head_names is None:
        head_names = [f"head {h}" for h in range(n_heads)]
    if len(head_names) != n_heads:
        raise ValueError(
            f"expected {n_heads} head names, got {len(head_names)}"
        )
    heads = list(head_names)
    frame = pd.DataFrame(
        [
            {
                "head": heads[h],
                "query": ys[i],
                "key": xs[j],
                "weight": float(values[h, i, j]),
            }
            for h in range(n_heads)
            for i in range(rows)
            for j in range(cols)
        ]
    )
    return (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=xs, title="key"),
            y=alt.Y("query:N", sort=ys, title="query"),
            color=alt.Color(
                "weight:Q",
                title="weight",
                scale=alt.Scale(scheme="blues", domain=[0, 1]),
            ),
            tooltip=[
                alt.Tooltip("head:N"),
                alt.Tooltip("query:N"),
                alt.Tooltip("key:N"),
                alt.Tooltip("weight:Q", format=".3f"),
            ],
        )
        .properties(width=size, height=size)
        .facet(column=alt.Column("head:N", sort=heads, title=None))
        .properties(title=title)
    )
