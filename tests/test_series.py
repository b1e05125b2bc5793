"""Tests for transformer_lite.domains.series (chapter 14): RevIN undone
exactly and blind to a window's level and scale, patches against a
loop, a forecaster that reads its window only (no later value, each
channel alone, causal patches), gradients, and every refusal."""

import pytest
import torch
from torch.func import functional_call

from transformer_lite import seed_everything
from transformer_lite.domains.baselines import last_value
from transformer_lite.domains.series import (
    PatchForecaster,
    RevIN,
    check_window,
    n_patches,
    to_patches,
)
from transformer_lite.domains.splits import make_windows

SIZES = dict(
    patch_len=4,
    stride=2,
    d_model=8,
    n_heads=2,
    n_layers=2,
    d_ff=16,
    dropout=0.0,
)


def tiny_forecaster(L=12, H=3, C=2, seed=0, **fields):
    """A float64 PatchForecaster of SIZES, in eval mode."""
    seed_everything(seed)
    return PatchForecaster(L, H, C, **{**SIZES, **fields}).double().eval()


def windows(B=4, L=12, C=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, C, generator=g, dtype=torch.float64)


def random_affine(revin: RevIN, seed: int = 1) -> RevIN:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        revin.gamma.copy_(torch.rand(revin.gamma.shape, generator=g) + 0.5)
        revin.beta.copy_(torch.randn(revin.beta.shape, generator=g))
    return revin


@pytest.mark.parametrize("affine", [False, True])
def test_revin_denormalise_undoes_normalise(affine):
    revin = RevIN(3, affine=affine).double()
    if affine:
        random_affine(revin)
    x = windows(C=3) * 5 + 7
    z, moments = revin.normalise(x)
    torch.testing.assert_close(
        revin.denormalise(z, moments), x, rtol=1e-12, atol=1e-12
    )
    assert moments.mean.shape == moments.std.shape == (4, 1, 3)


def test_revin_standardises_each_window_and_channel():
    x = windows(C=3) * torch.tensor([1.0, 10.0, 100.0]) + 50
    z, _ = RevIN(3, affine=False).double().normalise(x)
    zeros = torch.zeros(4, 3, dtype=torch.float64)
    torch.testing.assert_close(z.mean(1), zeros, atol=1e-12, rtol=0)
    var = z.var(1, unbiased=False)
    torch.testing.assert_close(var, torch.ones_like(var), atol=1e-4, rtol=0)


@pytest.mark.parametrize("a, b", [(3.0, -2.0), (0.01, 100.0)])
def test_revin_is_blind_to_a_windows_level_and_scale(a, b):
    """z(a x + b) = z(x) for a > 0: to rounding when eps scales with
    a^2 (eps is added to the variance), and with a tiny eps. Rounding:
    a x + b holds a x to about 1e-16 |b| (1e-12 of 0.01 x at b = 100)."""
    revin = random_affine(RevIN(2).double())
    x = windows()
    z, _ = revin.normalise(x)
    scaled = random_affine(RevIN(2, eps=revin.eps * a**2).double())
    z_ab, _ = scaled.normalise(a * x + b)
    torch.testing.assert_close(z_ab, z, rtol=0, atol=1e-10)
    tiny = random_affine(RevIN(2, eps=1e-20).double())
    torch.testing.assert_close(
        tiny.normalise(a * x + b)[0],
        tiny.normalise(x)[0],
        rtol=0,
        atol=1e-10,
    )


def test_revin_is_not_blind_to_a_negative_scale():
    """The test above can fail: a < 0 flips the window."""
    revin = RevIN(2, affine=False).double()
    x = windows()
    assert not torch.allclose(revin.normalise(-x)[0], revin.normalise(x)[0])


def test_the_forecaster_maps_a_level_and_scale_through():
    """RevIN makes the whole forecaster equivariant: F(a x + b) =
    a F(x) + b (a > 0), to the effect of eps (tiny here)."""
    model = tiny_forecaster()
    random_affine(model.revin)
    model.revin.eps = 1e-14
    x = windows()
    torch.testing.assert_close(
        model(3.0 * x - 2.0), 3.0 * model(x) - 2.0, rtol=0, atol=1e-9
    )


def test_patches_pad_the_end_with_the_last_value():
    """N = (L - P) // S + 2 patches; patch k is x[kS : kS + P] of the
    window followed by S copies of its last value."""
    series = torch.arange(1.0, 11.0).view(1, 10)  # L = 10
    P, S = 4, 3
    patches = to_patches(series, P, S)  # (1, N, P)
    padded = series[0].tolist() + [10.0] * S
    N = n_patches(10, P, S)
    assert N == (10 - P) // S + 2 == 4
    expected = [padded[k * S : k * S + P] for k in range(N)]
    assert patches[0].tolist() == expected
    assert patches[0, -1].tolist() == [10.0, 10.0, 10.0, 10.0]


def test_forecaster_shapes_and_patch_count():
    model = tiny_forecaster(L=12, H=3, C=2)
    assert model.n_patches == (12 - 4) // 2 + 2
    assert model(windows()).shape == (4, 3, 2)
    assert tiny_forecaster(L=4, H=1, C=1)(windows(L=4, C=1)).shape == (4, 1, 1)


def test_the_forecast_reads_no_value_after_its_window():
    """The window with origin t, cut from a long series: changing every
    value at t or later (its own targets among them) changes neither
    its input nor its forecast."""
    model = tiny_forecaster(L=12, H=3, C=2)
    g = torch.Generator().manual_seed(0)
    series = torch.randn(60, 2, generator=g, dtype=torch.float64)
    for t in (12, 30, 57):
        inputs, _ = make_windows(series, 12, 3, t, t + 3)  # one window
        later = series.clone()
        later[t:] += 100 * torch.randn(60 - t, 2, generator=g).double()
        inputs_later, _ = make_windows(later, 12, 3, t, t + 3)
        assert torch.equal(inputs_later, inputs)
        assert torch.equal(model(inputs_later), model(inputs))
    with pytest.raises(ValueError, match=r"shape \(B, 12, 2\)"):
        model(series[None, :13])  # a longer window is refused


def test_each_channel_is_forecast_from_its_own_values():
    """Channel independence: the same weights read each channel alone."""
    model = tiny_forecaster(C=3)
    x = windows(C=3)
    y = model(x)
    other = x.clone()
    other[:, :, 1] = torch.randn(4, 12, dtype=torch.float64)
    changed = (model(other) != y).any(dim=1).any(dim=0)  # (C,)
    assert changed.tolist() == [False, True, False]
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(
        model(x[:, :, perm]), y[:, :, perm], rtol=0, atol=0
    )


@pytest.mark.parametrize("k", [0, 2, 4])
def test_a_causal_patch_reads_no_later_patch(k):
    """With causal=True, the encoder's output at patch k is the same
    whatever patches k + 1 .. N - 1 hold; without, it changes."""
    causal = tiny_forecaster(causal=True)
    plain = tiny_forecaster(causal=False)
    g = torch.Generator().manual_seed(k)
    N = causal.n_patches
    patches = torch.randn(3, N, 4, generator=g, dtype=torch.float64)
    other = patches.clone()
    other[:, k + 1 :] = torch.randn(3, N - k - 1, 4, generator=g).double()
    assert torch.equal(
        causal.encode(other)[:, : k + 1], causal.encode(patches)[:, : k + 1]
    )
    assert not torch.allclose(
        plain.encode(other)[:, : k + 1], plain.encode(patches)[:, : k + 1]
    )


def test_gradients_match_finite_differences():
    model = tiny_forecaster(L=8, H=2, C=1, n_layers=1, d_model=4, d_ff=8)
    x = windows(B=2, L=8, C=1).requires_grad_(True)
    w = model.embed.weight.detach().clone().requires_grad_(True)

    def forecast(window, weight):
        return functional_call(model, {"embed.weight": weight}, (window,))

    assert torch.autograd.gradcheck(forecast, (x, w))


def test_a_tiny_forecaster_learns_a_season_better_than_the_last_value(
    one_thread,
):
    seed_everything(0)
    t = torch.arange(400.0)
    series = torch.sin(2 * torch.pi * t / 8) + 0.05 * torch.randn(400)
    x, y = make_windows(series, 24, 4, 0, 300)
    x_test, y_test = make_windows(series, 24, 4, 300, 400)
    model = PatchForecaster(24, 4, 1, **{**SIZES, "d_model": 16})
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        ours = torch.nn.functional.mse_loss(model(x_test), y_test)
    naive = torch.nn.functional.mse_loss(last_value(x_test, 4), y_test)
    assert ours < 0.2 * naive, (float(ours), float(naive))


def test_wrong_windows_are_refused():
    model = tiny_forecaster()
    x = windows()
    with pytest.raises(ValueError, match=r"must have shape \(B, 12, 2\)"):
        model(x[:, :10])
    with pytest.raises(ValueError, match=r"must have shape \(B, 12, 2\)"):
        model(x[..., :1])
    with pytest.raises(ValueError, match=r"must have shape \(B, 12, 2\)"):
        model(x[0])
    with pytest.raises(ValueError, match="floating-point values, got torch"):
        model(x.long())
    x[1, 5, 0] = float("nan")
    with pytest.raises(
        ValueError,
        match="x holds nan at batch 1, time 5, "
        "channel 0: every value must be a finite number",
    ):
        model(x)
    assert check_window(x, values=False) is None  # shape only


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(input_len=3), "shorter than one patch of 4"),
        (dict(horizon=0), "horizon must be a positive int"),
        (dict(stride=0), "stride must be a positive int"),
        (dict(n_heads=3), "divisible by n_heads"),
        (dict(causal=1), "causal must be True or False"),
    ],
)
def test_bad_options_are_refused(fields, match):
    args = dict(input_len=12, horizon=3, n_channels=2, **SIZES)
    with pytest.raises(ValueError, match=match):
        PatchForecaster(**{**args, **fields})


def test_revin_needs_a_positive_eps():
    with pytest.raises(ValueError, match="eps must be positive"):
        RevIN(2, eps=0.0)
