"""Tables as tokens (chapter 14): the FT-Transformer of Gorishniy et al.
(2021), "Revisiting Deep Learning Models for Tabular Data".

Every column of a row becomes one token of width C:

.. math::

    T_j = x_j W_j + b_j \\quad \\text{(numeric feature } j)
    \\qquad
    T_j = E_j[c_j] + b_j \\quad \\text{(categorical feature } j)

with a weight vector W_j and a bias b_j of its own for each numeric
feature, and a table E_j of S_j rows for a categorical feature of S_j
values. A learned [CLS] token is appended *after* the feature tokens, as
FT-Transformer does; the tokens carry no positions, so attention treats
the row as a set of features and the [CLS] token's place changes only
the index it is read at (the last). The encoder is chapter 5's, pre-LN
as in the paper, and the prediction is Linear(ReLU(LayerNorm(T_cls))).

Where we differ from the paper: the feed-forward network is ReLU (the
paper's is ReGLU), and one dropout rate serves attention, the
feed-forward network and the residuals (the paper tunes them apart).
"""

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer_lite.checks import (
    check_bool,
    check_heads,
    check_int,
    check_real,
)
from transformer_lite.layers import Encoder, glorot_init
from transformer_lite.model import ModelBasics
from transformer_lite.viz import kept_weights

__all__ = ["FTTransformer", "FeatureTokenizer", "check_table"]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CODES = (torch.int64, torch.int32)  # what nn.Embedding looks up


def _check_block(
    x: object, name: str, width: int, kinds: tuple, what: str
) -> int | None:
    """The batch size of a (B, width) tensor ``x`` of one of the dtypes
    ``kinds``; None when ``x`` is None and ``width`` is 0."""
    if x is None:
        if width:
            raise ValueError(
                f"{name} is missing: this model reads {width} {name} "
                f"features, a (B, {width}) tensor of {what}"
            )
        return None
    if not isinstance(x, Tensor):
        raise ValueError(
            f"{name} must be a (B, {width}) tensor of {what}, got "
            f"{type(x).__name__}"
        )
    if x.dim() != 2 or x.size(1) != width:
        raise ValueError(
            f"{name} must have shape (B, {width}): one row per example, "
            f"one column per {name} feature, got {tuple(x.shape)}"
        )
    if x.dtype not in kinds:
        raise ValueError(f"{name} must hold {what}, got dtype {x.dtype}")
    return x.size(0)


def check_table(
    numeric: Tensor | None,
    categorical: Tensor | None,
    n_numeric: int,
    categories: Sequence[int],
    *,
    values: bool = True,
) -> int:
    """Raise a ``ValueError`` naming what is wrong unless ``numeric`` is
    a (B, n_numeric) floating tensor and ``categorical`` a (B, n_cat)
    integer tensor of the same B; with ``values``, also read the values:
    no NaN or infinity among the numbers, every category code j in
    [0, categories[j]). Returns B.

    Reading values waits for a GPU (a sync point): the model reads them
    on the CPU, and on a GPU only when asked (``check_values``).
    """
    rows = _check_block(
        numeric, "numeric", n_numeric, FLOATS, "floating-point numbers"
    )
    codes = _check_block(
        categorical,
        "categorical",
        len(categories),
        CODES,
        "integer category codes (torch.int64 or torch.int32)",
    )
    if rows is not None and codes is not None and rows != codes:
        raise ValueError(
            f"numeric and categorical must have one row per example, the "
            f"same B, got {rows} and {codes} rows"
        )
    if values and numeric is not None and numeric.numel():
        bad = ~torch.isfinite(numeric)  # (B, n_num)
        if bool(bad.any()):  # a sync point on a GPU
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"numeric holds {float(numeric[row, col])} at row {row}, "
                f"feature {col}: every value must be a finite number "
                "(fill or drop missing values before the model)"
            )
    if values and categorical is not None and categorical.numel():
        sizes = torch.tensor(categories, device=categorical.device)
        bad = (categorical < 0) | (categorical >= sizes)  # (B, n_cat)
        if bool(bad.any()):  # a sync point on a GPU
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"categorical feature {col} holds the code "
                f"{int(categorical[row, col])} at row {row}, outside its "
                f"{categories[col]} categories [0, {categories[col] - 1}]"
            )
    return numeric.size(0) if rows is not None else codes


class FeatureTokenizer(nn.Module):
    """One token per feature, and the [CLS] token last.

    Args:
        n_numeric: numeric features, each x_j -> x_j W_j + b_j.
        categories: the number of values S_j of each categorical
            feature, each code c_j -> E_j[c_j] + b_j; () for none.
        d_model: token width C.

    The categorical tables E_j are kept as one ``nn.Embedding`` of
    sum(S_j) rows, feature j's rows starting at ``offsets[j]``.

    Shape:
        numeric: (B, n_num); categorical: (B, n_cat);
        output: (B, n_num + n_cat + 1, C), the [CLS] token last.
    """

    def __init__(
        self, n_numeric: int, categories: Sequence[int], d_model: int
    ) -> None:
        super().__init__()
        check_int("n_numeric", n_numeric, low=0)
        check_int("d_model", d_model, low=1)
        categories = tuple(categories)
        for j, size in enumerate(categories):
            check_int(f"categories[{j}]", size, low=1)
        if n_numeric + len(categories) == 0:
            raise ValueError(
                "a table needs at least one feature: n_numeric is 0 and "
                "categories is empty"
            )
        self.n_numeric, self.categories = n_numeric, categories
        bound = d_model**-0.5  # each token starts near unit scale
        self.weight = nn.Parameter(torch.empty(n_numeric, d_model))
        self.bias = nn.Parameter(torch.empty(n_numeric, d_model))
        self.embedding = nn.Embedding(sum(categories), d_model)
        self.category_bias = nn.Parameter(
            torch.empty(len(categories), d_model)
        )
        self.cls = nn.Parameter(torch.empty(d_model))
        for p in (self.weight, self.bias, self.category_bias, self.cls):
            nn.init.uniform_(p, -bound, bound)
        nn.init.uniform_(self.embedding.weight, -bound, bound)
        starts = [sum(categories[:j]) for j in range(len(categories))]
        self.register_buffer(
            "offsets",
            torch.tensor(starts, dtype=torch.int64),
            persistent=False,
        )

    @property
    def n_tokens(self) -> int:
        """Tokens per row: one per feature, and the [CLS] token."""
        return self.n_numeric + len(self.categories) + 1

    def forward(
        self, numeric: Tensor | None, categorical: Tensor | None = None
    ) -> Tensor:
        """Checked by :class:`FTTransformer`, which calls it; ``numeric``
        is cast to the weights' dtype."""
        parts = []
        if self.n_numeric:
            x = numeric.to(self.weight.dtype).unsqueeze(-1)  # (B, n_num, 1)
            parts.append(x * self.weight + self.bias)  # (B, n_num, C)
        if self.categories:
            codes = categorical + self.offsets  # (B, n_cat), in one table
            e = self.embedding(codes)  # (B, n_cat, C)
            parts.append(e + self.category_bias)
        B = parts[0].size(0)
        cls = self.cls.expand(B, 1, -1)  # (B, 1, C)
        return torch.cat([*parts, cls], dim=1)  # (B, n_num + n_cat + 1, C)


class FTTransformer(ModelBasics, nn.Module):
    """Feature tokens, chapter 5's encoder, and a head on the [CLS]
    token: y = Linear(ReLU(LayerNorm(T_cls))) (Gorishniy et al., 2021).

    Args:
        n_numeric: numeric features.
        categories: values per categorical feature; () for none.
        d_model: token width C (192 in the paper's default).
        n_heads: attention heads H (8 in the paper).
        n_layers: encoder layers (3 in the paper).
        d_ff: the feed-forward network's inner width.
        dropout: one rate for every dropout.
        n_outputs: the head's outputs: 1 for a binary class's logit or a
            regression, K for K classes' scores.
        norm_first: pre-LN (True, the paper) or post-LN; in pre-LN the
            encoder's final LayerNorm is the head's LayerNorm.
        first_norm: keep the LayerNorm before the first layer's
            attention (pre-LN only). The paper removes it (False): the
            feature tokens enter attention as the tokenizer made them.

    Attributes:
        check_values: also read the inputs' values (NaN, category codes
            out of range) on a GPU, where it costs a sync point; on the
            CPU they are always read.

    Shape:
        numeric: (B, n_num); categorical: (B, n_cat); output:
        (B, n_outputs). :meth:`features`: (B, n_num + n_cat + 1, C);
        :meth:`cls_attention`: (n_layers, B, H, n_num + n_cat + 1).
    """

    def __init__(
        self,
        n_numeric: int,
        categories: Sequence[int] = (),
        d_model: int = 192,
        n_heads: int = 8,
        n_layers: int = 3,
        d_ff: int = 256,
        dropout: float = 0.1,
        n_outputs: int = 1,
        norm_first: bool = True,
        *,
        first_norm: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("n_heads", n_heads),
            ("n_layers", n_layers),
            ("d_ff", d_ff),
            ("n_outputs", n_outputs),
        ):
            check_int(name, value, low=1)
        check_int("d_model", d_model, low=1)
        check_heads(d_model, n_heads)
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_bool("norm_first", norm_first)
        check_bool("first_norm", first_norm)
        self.tokenizer = FeatureTokenizer(n_numeric, categories, d_model)
        self.encoder = Encoder(
            n_layers, d_model, n_heads, d_ff, dropout, norm_first
        )
        if norm_first and not first_norm:
            self.encoder.layers[0].norm1 = nn.Identity()
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(d_model, n_outputs))
        self.check_values = False
        glorot_init(self, ["tokenizer"])  # the tokens keep their own start

    def _check(self, numeric: Tensor | None, categorical: Tensor | None):
        t = self.tokenizer
        device = self.tokenizer.cls.device.type
        free = device == "cpu" and not torch.compiler.is_compiling()
        values = self.check_values or free
        check_table(
            numeric, categorical, t.n_numeric, t.categories, values=values
        )

    def features(
        self, numeric: Tensor | None, categorical: Tensor | None = None
    ) -> Tensor:
        """The encoder's output at every token, the [CLS] token last."""
        self._check(numeric, categorical)
        return self.encoder(self.tokenizer(numeric, categorical))

    def forward(
        self, numeric: Tensor | None, categorical: Tensor | None = None
    ) -> Tensor:
        cls = self.features(numeric, categorical)[:, -1]  # (B, C)
        return self.head(cls)  # (B, n_outputs)

    def cls_attention(
        self, numeric: Tensor | None, categorical: Tensor | None = None
    ) -> Tensor:
        """What the [CLS] token attends to: its row of every layer's
        attention weights, one pass in eval mode without gradients
        (``keep_weights``, as the charts of chapter 3). Each row sums to
        1 over the tokens (the features, then the [CLS] token itself).

        Shape:
            output: (n_layers, B, H, n_num + n_cat + 1).
        """
        modules = {"encoder": [a.self_attn for a in self.encoder.layers]}
        weights = kept_weights(self, modules, numeric, categorical)
        rows = [w[:, :, -1, :] for w in weights["encoder"]]  # (B, H, F+1)
        return torch.stack(rows)  # (n_layers, B, H, F + 1)
