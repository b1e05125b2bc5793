"""Time series for chapter 14, offline: US macroeconomic quarters
shipped with statsmodels (1959-2009), and a synthetic series whose
parts are returned apart, so that what can be learned (a trend, a
season, a level that holds) is told from what cannot (the noise, the
moment a level jumps).

Forecast changes, not levels. GDP and prices grow, and a series that
trends has no fixed mean or variance (it is not stationary): any later
window lies outside the range of the earlier ones. Worse, next
quarter's GDP is within 2% of this quarter's in nine quarters out of
ten, so "the last value" scores a mean squared error below a
thousandth of the level's variance while predicting nothing at all.
The growth rate, 100 log(x_t / x_{t-1}) percent per quarter, and the
change of an interest or unemployment rate, x_t - x_{t-1}, move about
a steady mean; on GDP's growth the last value does worse than that
mean would. There a forecast has to know something to look good.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_lite.checks import check_int, check_real
from transformer_lite.extras import require

__all__ = [
    "MACRO_COLUMNS",
    "Series",
    "SyntheticSeries",
    "macro_levels",
    "macro_series",
    "synthetic_series",
]

# What each of macrodata's columns becomes (see the module's docstring):
# "growth" = 100 log(x_t / x_{t-1}), percent per quarter; "change" =
# x_t - x_{t-1}; "level" = x_t, for columns that are rates already.
MACRO_COLUMNS = {
    "realgdp": "growth",  # real GDP, billions of 2005 dollars
    "realcons": "growth",  # real personal consumption
    "realinv": "growth",  # real private investment
    "realgovt": "growth",  # real government spending
    "realdpi": "growth",  # real disposable personal income
    "cpi": "growth",  # consumer price index: quarterly inflation
    "m1": "growth",  # money stock M1
    "tbilrate": "change",  # 3-month Treasury bill rate, percent
    "unemp": "change",  # unemployment rate, percent
    "pop": "growth",  # population
    "infl": "level",  # inflation, annualised percent
    "realint": "level",  # real interest rate, percent
}


@dataclass(frozen=True)
class Series:
    """Channels of one series over time, with their names.

    Shape:
        values: (N, C); quarters: N labels such as "1959Q2".
    """

    values: Tensor
    names: tuple[str, ...]
    quarters: tuple[str, ...]
    transforms: tuple[str, ...]  # per channel: growth, change or level


def _check_columns(columns: tuple[str, ...]) -> None:
    if not columns:
        raise ValueError("columns is empty: name at least one column")
    unknown = [c for c in columns if c not in MACRO_COLUMNS]
    if unknown:
        raise ValueError(
            f"macrodata has no column {unknown[0]!r}; its columns are "
            f"{', '.join(MACRO_COLUMNS)}"
        )


def macro_levels(
    columns: tuple[str, ...] = ("realgdp", "cpi", "tbilrate", "unemp"),
    dtype: torch.dtype = torch.float64,
) -> Series:
    """statsmodels' ``macrodata`` as published: 203 quarters, 1959Q1 to
    2009Q3, each column in its own units (needs the ``[domains]``
    extra)."""
    columns = tuple(columns)
    _check_columns(columns)
    macrodata = require("statsmodels.datasets.macrodata", "domains")
    frame = macrodata.load_pandas().data
    values = torch.tensor(frame[list(columns)].to_numpy(), dtype=dtype)
    quarters = tuple(
        f"{int(y)}Q{int(q)}"
        for y, q in zip(frame["year"], frame["quarter"], strict=True)
    )
    return Series(values, columns, quarters, ("level",) * len(columns))


def macro_series(
    columns: tuple[str, ...] = ("realgdp", "cpi", "tbilrate", "unemp"),
    dtype: torch.dtype = torch.float64,
) -> Series:
    """The ``columns`` of :func:`macro_levels` as :data:`MACRO_COLUMNS`
    says: growth in percent per quarter, change, or level. One quarter
    is lost to the differences: 202 quarters, 1959Q2 to 2009Q3.

    Shape:
        values: (202, C).
    """
    levels = macro_levels(columns, torch.float64)
    x = levels.values  # (203, C)
    kinds = tuple(MACRO_COLUMNS[c] for c in levels.names)
    out = []
    for j, kind in enumerate(kinds):
        if kind == "growth":
            out.append(100 * torch.diff(torch.log(x[:, j])))
        elif kind == "change":
            out.append(torch.diff(x[:, j]))
        else:
            out.append(x[1:, j])
    values = torch.stack(out, dim=1).to(dtype)  # (202, C)
    return Series(values, levels.names, levels.quarters[1:], kinds)


@dataclass(frozen=True)
class SyntheticSeries:
    """A synthetic series and its four parts.

    ``trend`` and ``season`` follow from the past; ``regime`` is a level
    that holds between jumps (learnable once seen, but no window can
    tell when the next jump comes); ``noise`` is independent of
    everything: no forecast does better on it than its mean, 0, so the
    noise's variance is the smallest mean squared error any model can
    reach, and a model that scores below it has seen the future.

    Shape:
        every part and ``values``: (n,).
    """

    trend: Tensor
    season: Tensor
    regime: Tensor
    noise: Tensor

    @property
    def values(self) -> Tensor:
        """What a forecaster sees: the sum of the four parts."""
        return self.trend + self.season + self.regime + self.noise

    @property
    def signal(self) -> Tensor:
        """Everything but the noise."""
        return self.trend + self.season + self.regime


def synthetic_series(
    n: int,
    seed: int = 0,
    trend: float = 0.005,
    period: int = 12,
    regimes: int = 2,
    noise: float = 0.3,
    *,
    amplitude: float = 1.0,
    jump: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> SyntheticSeries:
    """A trend, a season, level jumps and noise, seeded.

    Args:
        n: time steps.
        seed: one seed for the jumps and the noise.
        trend: the slope, added per step.
        period: the season's length in steps (0: no season); its shape
            is sin(2 pi t / p) + 0.5 sin(4 pi t / p), times ``amplitude``.
        regimes: level jumps, at steps drawn uniformly (0: none), each
            of a size drawn from N(0, s²) with s = ``jump``.
        noise: the standard deviation of the Gaussian noise.
    """
    check_int("n", n, low=2)
    check_int("seed", seed, low=0)
    check_real("trend", trend)
    check_int("period", period, low=0)
    check_int("regimes", regimes, low=0, high=n - 1)
    for name, value in (
        ("noise", noise),
        ("amplitude", amplitude),
        ("jump", jump),
    ):
        check_real(name, value, low=0.0)
    rng = torch.Generator().manual_seed(seed)
    t = torch.arange(n, dtype=torch.float64)
    season = torch.zeros(n, dtype=torch.float64)
    if period:
        phase = 2 * torch.pi * t / period
        season = amplitude * (torch.sin(phase) + 0.5 * torch.sin(2 * phase))
    steps = torch.randperm(n - 1, generator=rng)[:regimes] + 1  # 1 .. n-1
    sizes = jump * torch.randn(regimes, generator=rng, dtype=torch.float64)
    regime = torch.zeros(n, dtype=torch.float64)
    for step, size in zip(steps.tolist(), sizes, strict=True):
        regime[step:] += size  # the level holds from the jump on
    parts = SyntheticSeries(
        trend=trend * t,
        season=season,
        regime=regime,
        noise=noise * torch.randn(n, generator=rng, dtype=torch.float64),
    )
    return SyntheticSeries(
        *(
            p.to(dtype)
            for p in (parts.trend, parts.season, parts.regime, parts.noise)
        )
    )
