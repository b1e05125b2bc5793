"""Tests for transformer_lite.domains.splits (chapter 14): walk-forward
folds whose test targets all come after training, windows inside their
span, and statistics that no later value can move: every value after a
cut perturbed, the training tensors and the scaler's statistics stay
bit for bit the same."""

import pytest
import torch

from transformer_lite.domains.splits import (
    Fold,
    PastScaler,
    Standardiser,
    make_windows,
    walk_forward,
    window_origins,
)

N, L, H = 100, 12, 4


def index_series(n=N, channels=1):
    """Each value is its own time step: windows show what they read."""
    t = torch.arange(n, dtype=torch.float64)
    return t[:, None].repeat(1, channels)  # (N, C)


def noisy_series(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g, dtype=torch.float64) * 2 + 5


def test_folds_expand_and_tile_the_end_of_the_series():
    folds = walk_forward(N, L, H, n_folds=3, test_size=10)
    assert folds == [
        Fold(range(0, 70), range(70, 80)),
        Fold(range(0, 80), range(80, 90)),
        Fold(range(0, 90), range(90, 100)),
    ]


def test_every_test_target_comes_after_every_training_value():
    """On a series of time indices the windows' values are the steps
    they read: training inputs and targets < cut <= test targets."""
    series = index_series()
    for fold in walk_forward(N, L, H, n_folds=4, test_size=8):
        cut = fold.test.start
        train, test = fold
        x_train, y_train = make_windows(series, L, H, train.start, train.stop)
        x_test, y_test = make_windows(series, L, H, test.start, test.stop)
        assert x_train.max() < cut and y_train.max() < cut
        assert y_test.min() >= cut and y_test.max() < fold.test.stop
        assert max(x_train.max(), y_train.max()) < y_test.min()


def test_windows_are_the_values_just_before_their_targets():
    series = index_series(30, channels=2)
    x, y = make_windows(series, 5, 3, 10, 20)
    origins = window_origins(5, 3, 10, 20)
    assert list(origins) == list(range(10, 18))  # targets t .. t + 2 < 20
    assert x.shape == (8, 5, 2) and y.shape == (8, 3, 2)
    for i, t in enumerate(origins):
        assert x[i, :, 0].tolist() == list(range(t - 5, t))
        assert y[i, :, 1].tolist() == list(range(t, t + 3))
    x, _ = make_windows(series, 5, 3, 0, 30)
    assert x[0, 0, 0] == 0  # the first window starts at the series' start


def test_a_one_dimensional_series_has_one_channel():
    x, y = make_windows(torch.arange(20.0), 4, 2, 0, 20)
    assert x.shape == (15, 4, 1) and y.shape == (15, 2, 1)


def test_no_value_after_the_cut_reaches_training():
    """Perturb every value at or after the cut: the training windows,
    the scaler's statistics and the scaled training windows are bit for
    bit the same."""
    series = noisy_series()
    cut = 70
    later = series.clone()
    later[cut:] = later[cut:] * 10 + torch.randn(N - cut, 3).double()

    def training(s):
        scaler = PastScaler(s, cut)
        x, y = make_windows(scaler.transform(s), L, H, 0, cut)
        raw = make_windows(s, L, H, 0, cut)
        return scaler, (x, y, *raw)

    scaler, tensors = training(series)
    scaler_later, tensors_later = training(later)
    assert torch.equal(scaler_later.mean, scaler.mean)
    assert torch.equal(scaler_later.std, scaler.std)
    for a, b in zip(tensors_later, tensors, strict=True):
        assert torch.equal(a, b)


def test_a_value_before_the_cut_does_reach_training():
    """The test above can fail: the last value before the cut is a
    training target and moves the scaler."""
    series = noisy_series()
    cut = 70
    before = series.clone()
    before[cut - 1] += 1.0
    assert not torch.equal(
        PastScaler(before, cut).mean, PastScaler(series, cut).mean
    )
    assert not torch.equal(
        make_windows(before, L, H, 0, cut)[1],
        make_windows(series, L, H, 0, cut)[1],
    )


def test_standardiser_matches_scikit_learn():
    preprocessing = pytest.importorskip("sklearn.preprocessing")
    rows = noisy_series()
    rows[:, 2] = 4.0  # a constant column
    ours = Standardiser(rows[:60])
    theirs = preprocessing.StandardScaler().fit(rows[:60].numpy())
    expected = torch.from_numpy(theirs.transform(rows.numpy()))
    torch.testing.assert_close(ours.transform(rows), expected)
    torch.testing.assert_close(ours.inverse(ours.transform(rows)), rows)
    assert ours.std[2] == 1.0


@pytest.mark.parametrize(
    "args, match",
    [
        ((N, L, H, 3, 3), r"test_size \(3\) must be at least the horizon"),
        ((N, L, H, 9, 10), "leave the first fold 10 values to train on"),
        ((N, L, 0, 3, 10), "horizon must be a positive int"),
    ],
)
def test_folds_that_cannot_work_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        walk_forward(*args)


def test_windows_and_scalers_refuse_what_cannot_work():
    series = index_series(30)
    with pytest.raises(ValueError, match=r"no window .* in \[25, 27\)"):
        make_windows(series, 5, 3, 25, 27)
    with pytest.raises(ValueError, match="past the series' end"):
        make_windows(series, 5, 3, 0, 31)
    with pytest.raises(ValueError, match="floating-point values"):
        make_windows(torch.arange(30), 5, 3, 0, 30)
    with pytest.raises(ValueError, match=r"\(N,\) or \(N, C\)"):
        make_windows(torch.zeros(2, 30, 1), 5, 3, 0, 30)
    with pytest.raises(ValueError, match="must lie inside the series"):
        PastScaler(series, 31)
    with pytest.raises(ValueError, match="stop must be a positive int"):
        PastScaler(series, 0)
