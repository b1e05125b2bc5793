"""The forecasts a Transformer must beat (chapter 14): the last value,
the last season, and DLinear (Zeng et al., 2023, "Are Transformers
Effective for Time Series Forecasting?").

Each is called as the forecaster is, ``model(x)`` with x (B, L, C), and
returns (B, H, C): the baselines take the same windows and are scored
by the same code.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.checks import check_bool, check_int
from transformer_lite.domains.series import check_window, reads_values

__all__ = [
    "DLinear",
    "LastValue",
    "SeasonalLastValue",
    "last_value",
    "moving_average",
    "seasonal_last_value",
]


def last_value(x: Tensor, horizon: int) -> Tensor:
    """Every future value is the last one seen: y_{t+h} = x_t.

    Shape:
        x: (B, L, C); output: (B, H, C).
    """
    check_int("horizon", horizon, low=1)
    check_window(x, values=reads_values(x))
    return x[:, -1:].repeat(1, horizon, 1)  # (B, H, C)


def seasonal_last_value(x: Tensor, horizon: int, period: int) -> Tensor:
    """The last season again: y_{t+h} = x_{t+h-p k}, with k the fewest
    whole periods p that reach back into the window.

    Shape:
        x: (B, L, C) with L >= period; output: (B, H, C).
    """
    check_int("horizon", horizon, low=1)
    check_int("period", period, low=1)
    check_window(x, values=reads_values(x))
    L = x.size(1)
    if L < period:
        raise ValueError(
            f"a window of {L} values holds no whole season of {period}: "
            "choose input_len >= period"
        )
    steps = torch.arange(horizon, device=x.device)  # h - 1 = 0 .. H - 1
    index = L - period + steps % period  # (H,): the same phase, last season
    return x[:, index]  # (B, H, C)


class LastValue(nn.Module):
    """:func:`last_value` as a module: ``LastValue(H)(x)``."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = check_int("horizon", horizon, low=1)

    def forward(self, x: Tensor) -> Tensor:
        return last_value(x, self.horizon)


class SeasonalLastValue(nn.Module):
    """:func:`seasonal_last_value` as a module."""

    def __init__(self, horizon: int, period: int) -> None:
        super().__init__()
        self.horizon = check_int("horizon", horizon, low=1)
        self.period = check_int("period", period, low=1)

    def forward(self, x: Tensor) -> Tensor:
        return seasonal_last_value(x, self.horizon, self.period)


def moving_average(x: Tensor, kernel_size: int) -> Tensor:
    """The trend: the mean of the ``kernel_size`` values centred on each
    step, the window's ends repeated (k - 1) / 2 times so every step has
    a full neighbourhood.

    Shape:
        x: (B, L, C); output: (B, L, C).
    """
    check_int("kernel_size", kernel_size, low=1)
    if kernel_size % 2 == 0:
        raise ValueError(
            f"kernel_size must be odd, so the average is centred, got "
            f"{kernel_size}"
        )
    half = (kernel_size - 1) // 2
    series = x.transpose(1, 2)  # (B, C, L)
    padded = F.pad(series, (half, half), mode="replicate")  # (B, C, L+k-1)
    trend = padded.unfold(2, kernel_size, 1).mean(-1)  # (B, C, L)
    return trend.transpose(1, 2)  # (B, L, C)


class DLinear(nn.Module):
    """DLinear: the window split into a trend (a moving average) and a
    remainder, each mapped to the horizon by one linear layer over time.

    .. math::

        \\hat y_c = W^{trend}_c\\, \\mathrm{MA}(x_c) + b^{trend}_c
        + W^{rem}_c\\, (x_c - \\mathrm{MA}(x_c)) + b^{rem}_c

    Args:
        input_len: L.
        horizon: H.
        n_channels: C.
        kernel_size: the moving average's width (odd; 25 in the paper).
        individual: one pair of (H, L) weights per channel (True), or
            one pair shared by every channel (False).

    Shape:
        x: (B, L, C); output: (B, H, C).
    """

    def __init__(
        self,
        input_len: int,
        horizon: int,
        n_channels: int = 1,
        *,
        kernel_size: int = 25,
        individual: bool = False,
    ) -> None:
        super().__init__()
        for name, value in [
            ("input_len", input_len),
            ("horizon", horizon),
            ("n_channels", n_channels),
        ]:
            check_int(name, value, low=1)
        moving_average(torch.zeros(1, 1, 1), kernel_size)  # checks it
        check_bool("individual", individual)
        self.input_len, self.horizon = input_len, horizon
        self.n_channels, self.kernel_size = n_channels, kernel_size
        groups = n_channels if individual else 1  # weights per channel
        bound = input_len**-0.5  # as nn.Linear(L, H)
        shape = (groups, horizon, input_len)
        self.w_trend = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.w_rem = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.b_trend = nn.Parameter(torch.zeros(groups, horizon))
        self.b_rem = nn.Parameter(torch.zeros(groups, horizon))

    def _linear(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """y[b, h, c] = sum_l w[c, h, l] x[b, l, c] + b[c, h]."""
        y = torch.einsum("chl,blc->bhc", w.expand(self.n_channels, -1, -1), x)
        return y + b.T  # (B, H, C)

    def forward(self, x: Tensor) -> Tensor:
        check_window(
            x,
            length=self.input_len,
            channels=self.n_channels,
            values=reads_values(x),
        )
        x = x.to(self.w_trend.dtype)
        trend = moving_average(x, self.kernel_size)  # (B, L, C)
        remainder = x - trend
        return self._linear(trend, self.w_trend, self.b_trend) + self._linear(
            remainder, self.w_rem, self.b_rem
        )
