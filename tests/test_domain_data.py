"""Tests for transformer_lite.tasks.tables and tasks.series_data
(chapter 14): the shipped tables and series, seeded stratified folds,
scales fitted on training rows only, the claims of the series module's
docstring, and the synthetic series' parts."""

import sys

import pytest
import torch

from transformer_lite.domains.tabular import FTTransformer
from transformer_lite.tasks.series_data import (
    MACRO_COLUMNS,
    macro_levels,
    macro_series,
    synthetic_series,
)
from transformer_lite.tasks.tables import (
    breast_cancer,
    diabetes,
    kfold,
    standardise,
)


def test_breast_cancer_is_569_tumours_of_30_features():
    table = breast_cancer()
    assert table.numeric.shape == (569, 30) and len(table) == 569
    assert table.numeric.dtype == torch.float32
    assert len(table.numeric_names) == 30
    assert table.numeric_names[0] == "mean radius"
    assert table.categorical.shape == (569, 0) and table.categories == ()
    assert table.target_names == ("malignant", "benign")
    assert torch.bincount(table.target).tolist() == [212, 357]
    assert table.task == "binary"


def test_diabetes_keeps_sex_as_a_category():
    table = diabetes()
    assert table.numeric.shape == (442, 9)
    assert "sex" not in table.numeric_names and "bmi" in table.numeric_names
    assert table.categorical_names == ("sex",) and table.categories == (2,)
    assert sorted(table.categorical.unique().tolist()) == [0, 1]
    assert table.target.shape == (442,) and table.task == "regression"
    assert 20 < float(table.numeric[:, 0].mean()) < 80  # age, in years


def test_an_ft_transformer_reads_both_tables():
    for table in (breast_cancer(), diabetes()):
        model = FTTransformer(
            len(table.numeric_names),
            table.categories,
            d_model=8,
            n_heads=2,
            n_layers=1,
            d_ff=16,
        )
        assert model(table.numeric, table.categorical).shape == (len(table), 1)


def test_folds_cover_every_row_once_and_keep_class_proportions():
    table = breast_cancer()
    folds = kfold(len(table), 5, seed=0, labels=table.target)
    tested = torch.cat([f.test for f in folds])
    assert sorted(tested.tolist()) == list(range(569))
    for fold in folds:
        assert len(set(fold.train.tolist()) & set(fold.test.tolist())) == 0
        assert len(fold.train) + len(fold.test) == 569
        counts = torch.bincount(table.target[fold.test], minlength=2)
        assert abs(int(counts[0]) - 212 / 5) <= 1  # malignant, to a row
        assert abs(int(counts[1]) - 357 / 5) <= 1
    again = kfold(len(table), 5, seed=0, labels=table.target)
    pairs = zip(folds, again, strict=True)
    assert all(torch.equal(a.test, b.test) for a, b in pairs)
    other = kfold(len(table), 5, seed=1, labels=table.target)
    assert not torch.equal(other[0].test, folds[0].test)


def test_plain_folds_and_their_refusals():
    folds = kfold(10, 3, seed=0)
    assert sorted(len(f.test) for f in folds) == [3, 3, 4]
    with pytest.raises(ValueError, match=r"k must be an int in \[2, 10\]"):
        kfold(10, 11)
    with pytest.raises(ValueError, match=r"labels must have shape \(10,\)"):
        kfold(10, 2, labels=torch.zeros(9))


def test_the_scale_comes_from_the_training_rows_only():
    table = breast_cancer(torch.float64)
    fold = kfold(len(table), 5, seed=0, labels=table.target)[0]
    scaled, scaler = standardise(table, fold.train)
    train = scaled.numeric[fold.train]
    torch.testing.assert_close(train.mean(0), torch.zeros(30).double())
    torch.testing.assert_close(
        train.std(0, unbiased=False), torch.ones(30).double()
    )
    moved = table.numeric.clone()
    moved[fold.test] *= 100.0  # the test rows change beyond recognition
    table_moved = type(table)(**{**table.__dict__, "numeric": moved})
    _, scaler_moved = standardise(table_moved, fold.train)
    assert torch.equal(scaler_moved.mean, scaler.mean)
    assert torch.equal(scaler_moved.std, scaler.std)
    rows = scaled.rows(fold.test)
    assert rows.numeric.shape == (len(fold.test), 30)


def test_macrodata_levels_and_their_changes():
    levels = macro_levels()
    assert levels.values.shape == (203, 4)
    assert levels.quarters[0] == "1959Q1" and levels.quarters[-1] == "2009Q3"
    series = macro_series()
    assert series.values.shape == (202, 4)
    assert series.quarters == levels.quarters[1:]
    assert series.transforms == ("growth", "growth", "change", "change")
    gdp, rate = levels.values[:, 0], levels.values[:, 2]
    growth = 100 * torch.log(gdp[5] / gdp[4])
    torch.testing.assert_close(series.values[4, 0], growth)
    torch.testing.assert_close(series.values[4, 2], rate[5] - rate[4])
    infl = macro_series(("infl",))
    assert torch.equal(
        infl.values[:, 0], macro_levels(("infl",)).values[1:, 0]
    )


def test_the_last_level_looks_excellent_and_the_last_growth_does_not():
    """The series module's docstring, checked: GDP within 2% of the
    last quarter in nine quarters out of ten; the last value's squared
    error under a thousandth of the level's variance; on growth, above
    the growth's variance (worse than its mean)."""
    gdp = macro_levels(("realgdp",)).values[:, 0]
    growth = macro_series(("realgdp",)).values[:, 0]
    assert (growth.abs() < 2).double().mean() >= 0.9
    naive_level = (gdp[1:] - gdp[:-1]).pow(2).mean()
    assert naive_level < 1e-3 * gdp.var()
    naive_growth = (growth[1:] - growth[:-1]).pow(2).mean()
    assert naive_growth > growth.var()


def test_unknown_columns_and_a_missing_extra_are_named(monkeypatch):
    with pytest.raises(ValueError, match="macrodata has no column 'gdp'"):
        macro_series(("gdp",))
    assert "realgdp" in MACRO_COLUMNS
    monkeypatch.setitem(sys.modules, "statsmodels.datasets.macrodata", None)
    with pytest.raises(ImportError, match=r"transformer-lite\[domains\]"):
        macro_levels()


def test_synthetic_parts_add_up_and_are_what_they_say():
    s = synthetic_series(
        240, seed=3, trend=0.01, period=12, regimes=3, noise=0.5
    )
    torch.testing.assert_close(
        s.values, s.trend + s.season + s.regime + s.noise, rtol=0, atol=0
    )
    torch.testing.assert_close(s.signal, s.trend + s.season + s.regime)
    t = torch.arange(240, dtype=torch.float64)
    torch.testing.assert_close(s.trend, 0.01 * t)
    torch.testing.assert_close(s.season[12:], s.season[:-12])  # period 12
    assert abs(float(s.season.mean())) < 1e-12  # whole periods
    jumps = torch.diff(s.regime).nonzero()
    assert len(jumps) == 3 and s.regime[0] == 0
    assert 0.4 < float(s.noise.std()) < 0.6
    again = synthetic_series(
        240, seed=3, trend=0.01, period=12, regimes=3, noise=0.5
    )
    assert torch.equal(again.values, s.values)
    assert not torch.equal(
        synthetic_series(240, seed=4).noise,
        synthetic_series(240, seed=3).noise,
    )


def test_synthetic_options_that_switch_parts_off_and_refusals():
    s = synthetic_series(50, period=0, regimes=0, noise=0.0, trend=0.0)
    assert torch.equal(s.values, torch.zeros(50, dtype=torch.float64))
    assert synthetic_series(50, dtype=torch.float32).values.dtype == (
        torch.float32
    )
    with pytest.raises(ValueError, match="noise must be a finite number"):
        synthetic_series(50, noise=-1.0)
    with pytest.raises(ValueError, match="regimes must be an int in"):
        synthetic_series(50, regimes=50)
