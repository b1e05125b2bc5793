"""Charts for the book: attention weights, masks, tables (all chapters).

Altair charts are interactive (tooltips) and render offline in the book.
Altair and pandas are imported when a chart is drawn, so the package itself
needs only torch.
"""

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from transformer_lite.extras import require

__all__ = [
    "attention_chart",
    "attention_explorer",
    "collect_attention",
    "heads_chart",
    "heatmap",
    "kept_weights",
    "mask_chart",
]


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
    alt = require("altair", "book")
    pd = require("pandas", "book")

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
    size: int = 120,  # four panels fit the book's text column
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
    alt = require("altair", "book")
    pd = require("pandas", "book")

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


# Chapter 7: every attention map of a trained translation model.

ATTENTION_KINDS = {  # key of collect_attention -> name in the explorer
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}


def collect_attention(
    model, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None
) -> dict[str, list[Tensor]]:
    """The attention weights of every layer and head for one teacher-forced
    pass of ``src`` and ``tgt`` through a Transformer (eval mode, no
    gradients), collected with ``MultiHeadAttention.keep_weights``.

    Returns:
        ``{"encoder": [...], "decoder": [...], "cross": [...]}``, one
        tensor per layer.

    Shape:
        src: (B, S); tgt: (B, T), the decoder's input (BOS first);
        encoder: (B, H, S, S); decoder: (B, H, T, T); cross: (B, H, T, S).
    """
    modules = {
        "encoder": [layer.self_attn for layer in model.encoder.layers],
        "decoder": [layer.self_attn for layer in model.decoder.layers],
        "cross": [layer.cross_attn for layer in model.decoder.layers],
    }
    return kept_weights(model, modules, src, tgt, src_mask)


def kept_weights(
    model, modules: dict[str, list], *inputs
) -> dict[str, list[Tensor]]:
    """Run ``model(*inputs)`` once (eval mode, no gradients) with
    ``keep_weights`` on in the attention ``modules`` and return their
    weights, ``{kind: [one tensor per layer]}``; the modules and the
    model are left as they were. A decoder-only model (chapter 10) has
    one kind, ``{"decoder": [...]}``."""
    every = [m for kind in modules.values() for m in kind]
    kept, was_training = [m.keep_weights for m in every], model.training
    try:
        for m in every:
            m.keep_weights = True
        model.eval()
        with torch.no_grad():
            model(*inputs)
        return {k: [m.weights for m in kind] for k, kind in modules.items()}
    finally:
        for m, keep in zip(every, kept, strict=True):
            m.keep_weights, m.weights = keep, None
        model.train(was_training)


def _attention_rows(weights, sources, targets, predicted, names):
    """One (example, attention, layer, head, query, q, key, k, weight)
    tuple per weight drawn; future and padding positions left out."""
    axes = {  # (query labels, key labels) of each kind of attention
        "encoder": (sources, sources),
        "decoder": (predicted, targets),
        "cross": (predicted, sources),
    }
    rows = []
    for kind, layers in weights.items():
        queries, keys = axes[kind]
        for layer, w in enumerate(layers):
            w = w.detach().float().cpu()  # (B, H, Lq, Lk)
            for b, h in itertools.product(range(len(names)), range(w.size(1))):
                for i, query in enumerate(queries[b]):
                    last = i + 1 if kind == "decoder" else len(keys[b])
                    rows += [
                        (names[b], ATTENTION_KINDS[kind], layer, h,
                         f"{i}:{query}", i, f"{j}:{keys[b][j]}", j,
                         round(float(w[b, h, i, j]), 4))
                        for j in range(last)
                    ]  # fmt: skip
    return rows


def attention_explorer(
    weights: dict[str, list[Tensor]],
    sources: Sequence[Sequence[str]],
    targets: Sequence[Sequence[str]],
    names: Sequence[str] | None = None,
    *,
    predicted: Sequence[Sequence[str]] | None = None,
    title: str = "Attention weights of the trained model",
    size: int = 280,
    max_rows: int = 5000,
):
    """An interactive heatmap of every attention map: menus choose the
    example, the attention (encoder self-, decoder self- or
    cross-attention), the layer and the head (chapter 7).

    The decoder's masked future (weight 0) and padding positions are left
    out, so that the chart's data stays small; more than ``max_rows``
    rows raise a ``ValueError`` (the data is embedded in the page).

    Args:
        weights: from :func:`collect_attention`, for B examples, or
            the kinds a model has (a decoder-only model: "decoder").
        sources: each example's S_b source tokens (labels).
        targets: each example's T_b decoder input tokens (labels).
        names: a menu entry per example (default: the joined source).
        predicted: labels for the decoder's query rows, e.g. the token
            each position predicts (default: ``targets``).

    Shape:
        weights: "encoder" (B, H, S, S); "decoder" (B, H, T, T);
        "cross" (B, H, T, S), one per layer; S >= S_b, T >= T_b.
    """
    alt = require("altair", "book")
    pd = require("pandas", "book")

    names = list(names or ["".join(s) for s in sources])
    predicted = targets if predicted is None else predicted
    if not len(names) == len(set(names)) == len(sources) == len(targets):
        raise ValueError("need one distinct name and target per source")
    if [len(p) for p in predicted] != [len(t) for t in targets]:
        raise ValueError("need one predicted label per target token")
    rows = _attention_rows(weights, sources, targets, predicted, names)
    if len(rows) > max_rows:
        raise ValueError(
            f"{len(rows)} rows > max_rows={max_rows}: use fewer or shorter "
            "examples"
        )
    columns = "example attention layer head query q key k weight".split()
    frame = pd.DataFrame(rows, columns=columns)
    layers = sorted(frame["layer"].unique().tolist())
    heads = sorted(frame["head"].unique().tolist())
    kinds = [name for key, name in ATTENTION_KINDS.items() if key in weights]
    menus = {  # column -> (options, first value, widget)
        "example": (names, names[0], alt.binding_select),
        "attention": (kinds, kinds[-1], alt.binding_radio),
        "layer": (layers, layers[-1], alt.binding_radio),
        "head": (heads, heads[0], alt.binding_radio),
    }
    chart = alt.Chart(frame, title=title).mark_rect().encode(
        x=alt.X("key:N", title="key (attended to)",
                sort=alt.EncodingSortField("k", op="min")),
        y=alt.Y("query:N", title="query (attending)",
                sort=alt.EncodingSortField("q", op="min")),
        color=alt.Color("weight:Q", title="weight",
                        scale=alt.Scale(scheme="blues", domain=[0, 1])),
        tooltip=["attention:N", "layer:O", "head:O", "query:N", "key:N",
                 alt.Tooltip("weight:Q", format=".3f")],
    )  # fmt: skip
    for column, (options, value, widget) in menus.items():
        menu = alt.param(
            name=f"pick_{column}",
            value=value,
            bind=widget(options=options, name=f"{column} "),
        )
        chart = chart.add_params(menu).transform_filter(
            alt.datum[column] == menu
        )
    return chart.properties(width=size, height=size)
