"""Checkers for the graded exercises (the classroom edition).

Each compares a student's answer with what is expected and, when they
differ, raises :class:`WrongAnswer` (an ``AssertionError``, which is what
nbgrader counts as a failed check) with a message that says *what* is
wrong, in the order a student should look: not a tensor, the wrong shape,
the wrong dtype, NaN or infinity, then the largest difference and where
it is, and last a ``hint`` written with the exercise.

Example::

    >>> expect_close("weights", torch.ones(2, 3), torch.ones(2, 4))
    Traceback (most recent call last):
    ...
    WrongAnswer: weights has shape (2, 3); expected (2, 4).
"""

import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "WrongAnswer",
    "expect",
    "expect_close",
    "expect_equal",
    "expect_raises",
    "expect_tensor",
]


class WrongAnswer(AssertionError):
    """A graded check failed; the message says what is wrong."""


def _fail(message: str, hint: str | None) -> None:
    raise WrongAnswer(message + (f"\nHint: {hint}" if hint else ""))


def expect(condition: bool, message: str, *, hint: str | None = None) -> None:
    """Raise :class:`WrongAnswer` with ``message`` unless ``condition``."""
    if not condition:
        _fail(message, hint)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The position of element ``flat`` of a row-major tensor."""
    position = []
    for size in reversed(shape):
        position.append(flat % size)
        flat //= size
    return tuple(reversed(position))


def expect_tensor(
    name: str,
    got: object,
    *,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    finite: bool = True,
    hint: str | None = None,
) -> Tensor:
    """``got`` is a tensor of this ``shape`` and ``dtype`` (either may be
    left out) and, with ``finite``, holds no NaN or infinity. Returns it."""
    if not isinstance(got, Tensor):
        _fail(f"{name} should be a torch.Tensor, got "
              f"{type(got).__name__}.", hint)  # fmt: skip
    if shape is not None and tuple(got.shape) != tuple(shape):
        _fail(f"{name} has shape {tuple(got.shape)}; expected "
              f"{tuple(shape)}.", hint)  # fmt: skip
    if dtype is not None and got.dtype != dtype:
        _fail(f"{name} has dtype {got.dtype}; expected {dtype}.", hint)
    if finite and got.is_floating_point():
        bad = ~torch.isfinite(got.detach())
        if bad.any():
            first = _index(int(bad.flatten().nonzero()[0]), got.shape)
            kind = "NaN" if torch.isnan(got.detach()).any() else "infinity"
            values = _count(int(bad.sum()), "non-finite value")
            _fail(f"{name} holds {values} ({kind}), the first at index "
                  f"{first}.", hint)  # fmt: skip
    return got


def expect_close(
    name: str,
    got: object,
    want: Tensor,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    hint: str | None = None,
) -> None:
    """``got`` equals the tensor ``want`` within ``atol + rtol * |want|``
    everywhere, after the checks of :func:`expect_tensor` (same shape; a
    NaN where ``want`` has none is wrong)."""
    got = expect_tensor(name, got, shape=want.shape,
                        finite=bool(torch.isfinite(want).all()),
                        hint=hint)  # fmt: skip
    g = got.detach().to(torch.float64).cpu()
    w = want.detach().to(torch.float64).cpu()
    gap = (g - w).abs()
    both_inf = torch.isinf(g) & torch.isinf(w) & (g == w)
    gap = gap.masked_fill(both_inf, 0.0)
    if gap.numel() and bool((gap > atol + rtol * w.abs()).any()):
        flat = int(gap.flatten().argmax())
        at = _index(flat, gap.shape)
        _fail(f"{name} differs from the expected values: the largest "
              f"difference is {float(gap.flatten()[flat]):.3g}, at index "
              f"{at} (got {float(g.flatten()[flat]):.4g}, expected "
              f"{float(w.flatten()[flat]):.4g}).", hint)  # fmt: skip


def expect_equal(
    name: str, got: object, want: object, *, hint: str | None = None
) -> None:
    """``got == want`` for numbers, strings, lists and tuples (a tensor:
    every element equal, same shape)."""
    if isinstance(want, Tensor):
        got = expect_tensor(name, got, shape=want.shape, finite=False,
                            hint=hint)  # fmt: skip
        if not torch.equal(got.cpu(), want.cpu()):
            wrong = (got.cpu() != want.cpu()).flatten().nonzero()
            at = _index(int(wrong[0]), want.shape)
            _fail(f"{name} differs in {_count(len(wrong), 'place')}, the "
                  f"first at index {at} (got {got[at].item()}, expected "
                  f"{want[at].item()}).", hint)  # fmt: skip
        return
    if got != want:
        _fail(f"{name} is {got!r}; expected {want!r}.", hint)


def expect_raises(
    error: type[BaseException],
    call: Callable[[], object],
    *,
    match: str | None = None,
    hint: str | None = None,
) -> None:
    """``call()`` raises ``error`` (whose message matches the regular
    expression ``match``, if given)."""
    try:
        call()
    except error as raised:
        if match is not None and not re.search(match, str(raised)):
            _fail(f"the {error.__name__} says {str(raised)!r}, which does "
                  f"not match {match!r}.", hint)  # fmt: skip
        return
    except NotImplementedError:
        raise
    except Exception as other:  # noqa: BLE001 - named in the message
        _fail(f"expected a {error.__name__}, got {type(other).__name__}: "
              f"{other}", hint)  # fmt: skip
    _fail(f"expected a {error.__name__}; nothing was raised.", hint)
