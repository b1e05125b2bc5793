"""Splits that keep the future out of training (chapter 14).

A forecast made at time t may read values before t only. Three places
let later values in unnoticed: a random split of windows (a training
target can come after a test input), windows whose targets cross the
cut, and statistics (a mean, a standard deviation) computed on the
whole series. Here:

* :func:`walk_forward`: expanding-window folds; each fold trains on the
  targets before its cut and tests on the ``test_size`` after it;
* :func:`make_windows`: (input, target) pairs whose targets all lie in
  [start, stop), inputs the L values just before each target;
* :class:`PastScaler`: standardisation by statistics of the values
  before a cut only (:class:`Standardiser`, for any rows, serves tables).

Indices count time steps of a series of N values, 0 .. N - 1. A window
with origin t reads [t - L, t) and forecasts [t, t + H).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from transformer_lite.checks import check_int

__all__ = [
    "Fold",
    "PastScaler",
    "Standardiser",
    "make_windows",
    "walk_forward",
    "window_origins",
]


class Fold(NamedTuple):
    """One walk-forward fold: the time steps whose values may be
    training targets (and inputs), and those that are test targets."""

    train: range
    test: range


def walk_forward(
    n: int, input_len: int, horizon: int, n_folds: int, test_size: int
) -> list[Fold]:
    """``n_folds`` expanding-window folds over a series of ``n`` values.

    The last ``n_folds * test_size`` values are cut into test spans in
    time order; fold k trains on everything before its test span, so
    each fold's training span grows by ``test_size``. Every test target
    comes strictly after every training target and input.

    Args:
        n: N, the series' length.
        input_len: L, the window a model reads.
        horizon: H, the values it forecasts (test_size >= H).
        n_folds: how many folds.
        test_size: the time steps of each fold's test span.
    """
    for name, value in [
        ("n", n),
        ("input_len", input_len),
        ("horizon", horizon),
        ("n_folds", n_folds),
        ("test_size", test_size),
    ]:
        check_int(name, value, low=1)
    if test_size < horizon:
        raise ValueError(
            f"test_size ({test_size}) must be at least the horizon "
            f"({horizon}): a test span holds whole forecasts"
        )
    first_cut = n - n_folds * test_size
    if first_cut < input_len + horizon:
        raise ValueError(
            f"{n_folds} folds of {test_size} leave the first fold "
            f"{max(first_cut, 0)} values to train on, fewer than one "
            f"window (input_len + horizon = {input_len + horizon})"
        )
    cuts = [first_cut + k * test_size for k in range(n_folds)]
    return [Fold(range(0, cut), range(cut, cut + test_size)) for cut in cuts]


def window_origins(
    input_len: int, horizon: int, start: int, stop: int
) -> range:
    """The origins t of every window whose targets [t, t + H) lie in
    [start, stop) and whose input [t - L, t) starts at 0 or later."""
    check_int("input_len", input_len, low=1)
    check_int("horizon", horizon, low=1)
    check_int("start", start, low=0)
    check_int("stop", stop, low=0)
    return range(max(start, input_len), stop - horizon + 1)


def _as_columns(series: object) -> Tensor:
    """``series`` as an (N, C) floating tensor ((N,) becomes (N, 1))."""
    if not isinstance(series, Tensor) or not series.is_floating_point():
        what = series.dtype if isinstance(series, Tensor) else type(series)
        raise ValueError(
            f"series must be an (N,) or (N, C) tensor of floating-point "
            f"values, got {what}"
        )
    if series.dim() not in (1, 2):
        raise ValueError(
            f"series must have shape (N,) or (N, C): time, channels, got "
            f"{tuple(series.shape)}"
        )
    return series if series.dim() == 2 else series.unsqueeze(1)


def make_windows(
    series: Tensor, input_len: int, horizon: int, start: int, stop: int
) -> tuple[Tensor, Tensor]:
    """(input, target) pairs with every target inside [start, stop).

    The inputs may reach back before ``start`` (the past is known when
    a forecast is made); no input or target reads ``stop`` or later.

    Shape:
        series: (N,) or (N, C); inputs: (n, L, C); targets: (n, H, C),
        n = len(:func:`window_origins`).
    """
    x = _as_columns(series)  # (N, C)
    if stop > x.size(0):
        raise ValueError(
            f"stop ({stop}) is past the series' end ({x.size(0)} values)"
        )
    origins = window_origins(input_len, horizon, start, stop)
    if len(origins) == 0:
        raise ValueError(
            f"no window of {input_len} inputs and {horizon} targets has "
            f"its targets in [{start}, {stop}): need stop - max(start, "
            f"input_len) >= horizon"
        )
    t = torch.tensor(origins, device=x.device)  # (n,)
    back = torch.arange(-input_len, 0, device=x.device)  # (L,)
    ahead = torch.arange(horizon, device=x.device)  # (H,)
    inputs = x[t[:, None] + back]  # (n, L, C)
    targets = x[t[:, None] + ahead]  # (n, H, C)
    return inputs, targets


class Standardiser:
    """(x - mean) / std per column, with the statistics of the rows it
    was fitted on: a training fold, never the rows it will judge.

    A column that is constant in those rows has std 1 (it is centred,
    not divided by zero). The standard deviation is the population one,
    as scikit-learn's ``StandardScaler``.

    Shape:
        rows: (n, F) or (n,); mean, std: (F,) or ().
    """

    def __init__(self, rows: Tensor) -> None:
        if not isinstance(rows, Tensor) or not rows.is_floating_point():
            raise ValueError("rows must be a floating-point tensor")
        if rows.dim() not in (1, 2) or rows.size(0) == 0:
            raise ValueError(
                f"rows must have shape (n, F) or (n,) with n >= 1, got "
                f"{tuple(rows.shape)}"
            )
        self.mean = rows.mean(dim=0)
        std = rows.std(dim=0, unbiased=False)
        self.std = torch.where(std > 0, std, torch.ones_like(std))

    def transform(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def inverse(self, z: Tensor) -> Tensor:
        return z * self.std + self.mean


class PastScaler(Standardiser):
    """A :class:`Standardiser` fitted on the values before ``stop`` only
    (a fold's training span): what comes later cannot move it.

    Shape:
        series: (N,) or (N, C); mean, std: (C,) or ().
    """

    def __init__(self, series: Tensor, stop: int) -> None:
        check_int("stop", stop, low=1)
        if not isinstance(series, Tensor) or stop > series.size(0):
            size = series.size(0) if isinstance(series, Tensor) else None
            raise ValueError(
                f"stop ({stop}) must lie inside the series ({size} values)"
            )
        super().__init__(series[:stop])
        self.stop = stop
