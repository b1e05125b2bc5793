"""Tests for transformer_lite.domains.baselines (chapter 14): the last
value, the last season exact on a periodic series, and DLinear against
its formula written out with loops."""

import pytest
import torch

from transformer_lite import seed_everything
from transformer_lite.domains.baselines import (
    DLinear,
    LastValue,
    SeasonalLastValue,
    last_value,
    moving_average,
    seasonal_last_value,
)
from transformer_lite.domains.splits import make_windows


def windows(B=3, L=10, C=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, C, generator=g, dtype=torch.float64)


def test_last_value_repeats_the_last_step():
    x = windows()
    y = last_value(x, 4)
    assert y.shape == (3, 4, 2)
    for h in range(4):
        assert torch.equal(y[:, h], x[:, -1])
    assert torch.equal(LastValue(4)(x), y)


@pytest.mark.parametrize("period, L, H", [(4, 8, 6), (5, 5, 12), (7, 20, 3)])
def test_the_last_season_is_exact_on_a_periodic_series(period, L, H):
    g = torch.Generator().manual_seed(period)
    season = torch.randn(period, 2, generator=g, dtype=torch.float64)
    series = season.repeat(10, 1)  # (10 p, 2), period p exactly
    x, y = make_windows(series, L, H, 0, len(series))
    assert torch.equal(seasonal_last_value(x, H, period), y)
    assert torch.equal(SeasonalLastValue(H, period)(x), y)
    wrong = seasonal_last_value(x, H, period + 1) if L > period else None
    assert wrong is None or not torch.equal(wrong, y)  # it can fail


def test_moving_average_against_a_loop():
    x = windows(L=9, C=2)
    k, half = 5, 2
    trend = moving_average(x, k)
    for b in range(3):
        for t in range(9):
            for c in range(2):
                near = [
                    x[b, min(max(s, 0), 8), c]
                    for s in range(t - half, t + half + 1)
                ]
                expected = torch.stack(near).mean()
                torch.testing.assert_close(trend[b, t, c], expected)
    assert torch.equal(moving_average(x, 1), x)


def dlinear_by_loops(model: DLinear, x: torch.Tensor) -> torch.Tensor:
    """y[b, h, c] = sum_l Wt[g, h, l] MA(x)[b, l, c] + bt[g, h]
    + sum_l Wr[g, h, l] (x - MA(x))[b, l, c] + br[g, h], g = c or 0."""
    B, L, C = x.shape
    trend = moving_average(x, model.kernel_size)
    remainder = x - trend
    y = torch.zeros(B, model.horizon, C, dtype=x.dtype)
    for b in range(B):
        for h in range(model.horizon):
            for c in range(C):
                g = c if model.w_trend.size(0) > 1 else 0
                total = model.b_trend[g, h] + model.b_rem[g, h]
                for t in range(L):
                    total = total + model.w_trend[g, h, t] * trend[b, t, c]
                    total = total + model.w_rem[g, h, t] * remainder[b, t, c]
                y[b, h, c] = total
    return y


@pytest.mark.parametrize("individual", [False, True])
def test_dlinear_is_its_formula(individual):
    seed_everything(0)
    model = DLinear(10, 3, 2, kernel_size=5, individual=individual).double()
    with torch.no_grad():  # biases that are not zero
        model.b_trend.normal_()
        model.b_rem.normal_()
    x = windows()
    torch.testing.assert_close(
        model(x), dlinear_by_loops(model, x), rtol=1e-12, atol=1e-12
    )
    groups = 2 if individual else 1
    assert model.w_trend.shape == (groups, 3, 10)


def test_shared_dlinear_treats_channels_alike_and_individual_does_not():
    seed_everything(0)
    shared = DLinear(10, 3, 2, kernel_size=5).double()
    own = DLinear(10, 3, 2, kernel_size=5, individual=True).double()
    x = windows()
    swap = torch.tensor([1, 0])
    assert torch.equal(shared(x[:, :, swap]), shared(x)[:, :, swap])
    assert not torch.allclose(own(x[:, :, swap]), own(x)[:, :, swap])


def test_refusals():
    x = windows()
    with pytest.raises(ValueError, match="horizon must be a positive int"):
        last_value(x, 0)
    with pytest.raises(ValueError, match="no whole season of 12"):
        seasonal_last_value(x, 3, 12)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        DLinear(10, 3, kernel_size=4)
    with pytest.raises(ValueError, match=r"shape \(B, 10, 2\)"):
        DLinear(10, 3, 2)(x[:, :8])
    x[0, 3, 1] = float("nan")
    for model in (LastValue(2), SeasonalLastValue(2, 4), DLinear(10, 2, 2)):
        with pytest.raises(ValueError, match="holds nan at batch 0, time 3"):
            model(x.float() if isinstance(model, DLinear) else x)
