"""Two medical tables shipped with scikit-learn (chapter 14; no
download): breast-cancer diagnosis (569 tumours, 30 numeric features
of their cell nuclei, malignant or benign) and diabetes progression
(442 patients, 10 baseline features, a number a year later).

A :class:`Table` keeps numeric and categorical columns apart, as the
FT-Transformer reads them (:mod:`transformer_lite.domains.tabular`).
:func:`kfold` cuts seeded (stratified) folds; :func:`standardise`
scales the numbers by the statistics of the training rows only, so a
test row never moves the scale the model was trained on.
"""

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import Tensor

from transformer_lite.checks import check_int
from transformer_lite.domains.splits import Standardiser
from transformer_lite.extras import require

__all__ = [
    "Table",
    "TableFold",
    "breast_cancer",
    "diabetes",
    "kfold",
    "standardise",
]


@dataclass(frozen=True)
class Table:
    """A table's columns as tensors, with their names.

    Shape:
        numeric: (n, n_num); categorical: (n, n_cat) int64 codes, code j
        in [0, categories[j]); target: (n,), int64 classes or floats.
    """

    numeric: Tensor
    categorical: Tensor
    target: Tensor
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]
    categories: tuple[int, ...]  # values per categorical column
    target_names: tuple[str, ...]  # the classes, or the one quantity
    task: str  # "binary" or "regression"

    def __len__(self) -> int:
        return self.target.size(0)

    def rows(self, index: Tensor) -> "Table":
        """The rows at ``index`` (a fold), every column kept."""
        return replace(
            self,
            numeric=self.numeric[index],
            categorical=self.categorical[index],
            target=self.target[index],
        )


def breast_cancer(dtype: torch.dtype = torch.float32) -> Table:
    """The Wisconsin diagnostic breast-cancer table: 30 numeric features
    (mean, standard error and worst value of ten measurements of the
    nuclei), target 0 = malignant (212), 1 = benign (357)."""
    data = require("sklearn.datasets", "domains").load_breast_cancer()
    n = len(data.target)
    return Table(
        numeric=torch.tensor(data.data, dtype=dtype),
        categorical=torch.zeros(n, 0, dtype=torch.int64),
        target=torch.tensor(data.target, dtype=torch.int64),
        numeric_names=tuple(str(f) for f in data.feature_names),
        categorical_names=(),
        categories=(),
        target_names=tuple(str(t) for t in data.target_names),
        task="binary",
    )


def diabetes(dtype: torch.dtype = torch.float32) -> Table:
    """The diabetes table in its own units (scikit-learn's
    ``scaled=False``): age, body-mass index, blood pressure and six
    blood serum measurements as numbers, sex as a category (codes 0 and
    1 for the table's 1 and 2); target: a measure of the disease's
    progression one year after the baseline."""
    data = require("sklearn.datasets", "domains").load_diabetes(scaled=False)
    names = [str(f) for f in data.feature_names]
    x = torch.tensor(data.data, dtype=torch.float64)
    sex = names.index("sex")
    numeric = [j for j in range(len(names)) if j != sex]
    return Table(
        numeric=x[:, numeric].to(dtype),
        categorical=(x[:, sex : sex + 1] - 1).to(torch.int64),
        target=torch.tensor(data.target, dtype=dtype),
        numeric_names=tuple(names[j] for j in numeric),
        categorical_names=("sex",),
        categories=(2,),
        target_names=("progression",),
        task="regression",
    )


class TableFold(NamedTuple):
    """The rows of one fold: sorted indices into the table."""

    train: Tensor
    test: Tensor


def kfold(
    n: int, k: int = 5, seed: int = 0, labels: Tensor | None = None
) -> list[TableFold]:
    """``k`` folds of ``n`` rows, each row in exactly one test set.

    The rows are shuffled (seeded); with ``labels`` each class is
    shuffled apart and dealt round the folds in turn, so every fold
    holds each class in the table's proportion (stratified), to one row.
    """
    check_int("n", n, low=1)
    check_int("k", k, low=2, high=n)
    rng = torch.Generator().manual_seed(seed)
    if labels is None:
        order = torch.randperm(n, generator=rng)
    else:
        if labels.shape != (n,):
            raise ValueError(
                f"labels must have shape ({n},), got {tuple(labels.shape)}"
            )
        groups = [(labels == c).nonzero()[:, 0] for c in labels.unique()]
        order = torch.cat(
            [g[torch.randperm(len(g), generator=rng)] for g in groups]
        )
    fold = torch.empty(n, dtype=torch.int64)
    fold[order] = torch.arange(n) % k  # dealt in turn
    every = torch.arange(n)
    return [TableFold(every[fold != i], every[fold == i]) for i in range(k)]


def standardise(table: Table, train: Tensor) -> tuple[Table, Standardiser]:
    """The table with its numeric columns standardised by the mean and
    standard deviation of the ``train`` rows only, and the
    :class:`~transformer_lite.domains.splits.Standardiser` that did it
    (categories and targets are left as they are)."""
    scaler = Standardiser(table.numeric[train])
    return replace(table, numeric=scaler.transform(table.numeric)), scaler
