"""The classroom checkers give the right marks: NaN and infinities are
values, tolerances are finite, a bool mask is not a float one, a numpy
answer is a wrong answer rather than a crash, and a stub's
NotImplementedError is never credited as the error an exercise names."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lite.classroom import (
    WrongAnswer,
    expect_close,
    expect_equal,
    expect_raises,
)

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    "got",
    [
        torch.tensor([0.0, 1.0, 2.0]),  # a finite number where -inf is
        torch.tensor([0.0, INF, 2.0]),  # the wrong sign
        torch.tensor([0.0, -INF, NAN]),  # a NaN where 2 is
        torch.tensor([NAN, -INF, 2.0]),  # a NaN where 0 is
    ],
)
def test_an_infinity_expected_is_compared_as_a_value(got):
    want = torch.tensor([0.0, -INF, 2.0])
    with pytest.raises(WrongAnswer, match="index"):
        expect_close("scores", got, want)
    expect_close("scores", want.clone(), want)  # the right answer passes


def test_a_nan_expected_must_be_matched_by_a_nan():
    want = torch.tensor([NAN, 1.0])
    expect_close("x", torch.tensor([NAN, 1.0]), want)
    with pytest.raises(WrongAnswer, match="NaN value must be where"):
        expect_close("x", torch.tensor([0.0, 1.0]), want)
    with pytest.raises(WrongAnswer, match="largest difference"):
        expect_close("x", torch.tensor([NAN, 5.0]), want)


@pytest.mark.parametrize("bad", [NAN, INF, -1.0, True, "0.1"])
def test_tolerances_must_be_finite_numbers(bad):
    x = torch.ones(2)
    with pytest.raises(ValueError, match="atol must be a finite number"):
        expect_close("x", x, x, atol=bad)
    with pytest.raises(ValueError, match="rtol must be a finite number"):
        expect_close("x", x, x, rtol=bad)


def test_a_float_mask_does_not_earn_the_bool_mask_point():
    want = torch.tensor([[True, False], [True, True]])
    with pytest.raises(WrongAnswer, match="dtype torch.float32 .floating."):
        expect_equal("mask", want.float(), want)
    with pytest.raises(WrongAnswer, match="integer"):
        expect_equal("ids", torch.tensor([1.0, 2.0]), torch.tensor([1, 2]))
    expect_equal("ids", torch.tensor([1, 2], dtype=torch.int32),
                 torch.tensor([1, 2]))  # fmt: skip
    with pytest.raises(WrongAnswer, match="dtype torch.int32; expected"):
        expect_equal("ids", torch.tensor([1, 2], dtype=torch.int32),
                     torch.tensor([1, 2]), dtype=torch.int64)  # fmt: skip
    with pytest.raises(WrongAnswer, match="dtype torch.float64"):
        expect_close("x", torch.ones(2, dtype=torch.float64), torch.ones(2),
                     dtype=torch.float32)  # fmt: skip


@pytest.mark.parametrize(
    "want", [[1, 2, 3], 3, (1, 2), torch.tensor([1, 2, 3])]
)
def test_a_numpy_answer_is_a_wrong_answer_not_a_crash(want):
    with pytest.raises(WrongAnswer):
        expect_equal("answer", np.array([1, 2, 3]), want)
    with pytest.raises(WrongAnswer):
        expect_close("answer", np.ones(3), torch.ones(3))


def test_a_tensor_is_not_a_list():
    with pytest.raises(WrongAnswer, match="should be a list"):
        expect_equal("pieces", torch.tensor([1, 2]), [1, 2])
    expect_equal("pieces", [1, 2], [1, 2])


def test_a_stub_is_not_credited_with_a_runtime_error():
    def stub():
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        expect_raises(RuntimeError, stub)

    def real():
        raise RuntimeError("sizes do not match")

    expect_raises(RuntimeError, real, match="sizes")
    expect_raises(NotImplementedError, stub)  # when that is what is asked


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
special = st.sampled_from([NAN, INF, -INF])


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(finite, min_size=1, max_size=8),
    spot=st.integers(0, 7),
    bad=special,
)
def test_no_nan_or_infinity_passes_against_finite_values(values, spot, bad):
    want = torch.tensor(values, dtype=torch.float64)
    got = want.clone()
    got[spot % len(values)] = bad
    with pytest.raises(WrongAnswer):
        expect_close("answer", got, want, atol=1e-3, rtol=1e-3)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(finite, special), min_size=1, max_size=8))
def test_the_expected_values_themselves_always_pass(values):
    want = torch.tensor(values, dtype=torch.float64)
    expect_close("answer", want.clone(), want, atol=0.0, rtol=0.0)
    assert all(math.isnan(v) == math.isnan(w) for v, w in
               zip(want.tolist(), values, strict=True))  # fmt: skip
