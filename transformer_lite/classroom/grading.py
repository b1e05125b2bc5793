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
    """A graded check failed; the message says what is wrong.

    In a notebook it shows as its message alone, headed by the exercise
    when one is known (``_render_traceback_``, which IPython calls in
    place of printing the frames): the frames are the checkers', and a
    student looking for what went wrong should not have to read them.
    """

    def __init__(self, message: str = "", *, exercise: str | None = None):
        super().__init__(message)
        self.exercise = exercise

    def _render_traceback_(self) -> list[str]:
        about = f" (exercise {self.exercise})" if self.exercise else ""
        return [f"WrongAnswer{about}:", *str(self).splitlines()]


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


def _check_tolerance(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0.0 <= value < float("inf")
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating" if dtype.is_floating_point else "integer"


def _same_kind(name: str, got: Tensor, want: Tensor, hint) -> None:
    """A float where a bool mask is expected (or an integer where a float
    is) is the wrong answer, whatever its values."""
    if _kind(got.dtype) != _kind(want.dtype):
        _fail(f"{name} has dtype {got.dtype} ({_kind(got.dtype)}); "
              f"expected {_kind(want.dtype)} values like {want.dtype}.",
              hint)  # fmt: skip


def expect_close(
    name: str,
    got: object,
    want: Tensor,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    dtype: torch.dtype | None = None,
    hint: str | None = None,
) -> None:
    """``got`` equals the tensor ``want`` within ``atol + rtol * |want|``
    everywhere, after the checks of :func:`expect_tensor` (same shape, and
    ``dtype`` if given). NaN and infinities are values: ``got`` must hold
    them exactly where ``want`` does, with the same signs.

    Raises:
        ValueError: a tolerance that is negative, infinite or NaN.
    """
    _check_tolerance("atol", atol)
    _check_tolerance("rtol", rtol)
    got = expect_tensor(name, got, shape=want.shape, dtype=dtype,
                        finite=bool(torch.isfinite(want).all()),
                        hint=hint)  # fmt: skip
    g = got.detach().to(torch.float64).cpu()
    w = want.detach().to(torch.float64).cpu()
    for special, word in ((torch.isnan, "NaN"), (torch.isinf, "infinite")):
        wrong = special(g) != special(w)
        if special is torch.isinf:
            wrong |= special(w) & (g != w)  # the sign of an infinity
        if bool(wrong.any()):
            flat = int(wrong.flatten().nonzero()[0])
            at = _index(flat, g.shape)
            _fail(f"{name} differs from the expected values at index {at}"
                  f" (got {float(g.flatten()[flat]):.4g}, expected "
                  f"{float(w.flatten()[flat]):.4g}): a {word} value must "
                  "be where it is expected, and only there.",
                  hint)  # fmt: skip
    finite = torch.isfinite(w)
    gap = torch.where(finite, (g - w).abs(), torch.zeros_like(w))
    if gap.numel() and bool((gap > atol + rtol * w.abs()).any()):
        flat = int(gap.flatten().argmax())
        at = _index(flat, gap.shape)
        _fail(f"{name} differs from the expected values: the largest "
              f"difference is {float(gap.flatten()[flat]):.3g}, at index "
              f"{at} (got {float(g.flatten()[flat]):.4g}, expected "
              f"{float(w.flatten()[flat]):.4g}).", hint)  # fmt: skip


def expect_equal(
    name: str,
    got: object,
    want: object,
    *,
    dtype: torch.dtype | None = None,
    hint: str | None = None,
) -> None:
    """``got == want`` for numbers, strings, lists and tuples. A tensor:
    every element equal, the same shape, the same kind of number (bool,
    integer, floating), and exactly ``dtype`` if given."""
    if isinstance(want, Tensor):
        got = expect_tensor(name, got, shape=want.shape, dtype=dtype,
                            finite=False, hint=hint)  # fmt: skip
        _same_kind(name, got, want, hint)
        if not torch.equal(got.cpu(), want.cpu().to(got.dtype)):
            wrong = (got.cpu() != want.cpu()).flatten().nonzero()
            at = _index(int(wrong[0]), want.shape)
            _fail(f"{name} differs in {_count(len(wrong), 'place')}, the "
                  f"first at index {at} (got {got[at].item()}, expected "
                  f"{want[at].item()}).", hint)  # fmt: skip
        return
    if isinstance(got, Tensor) or type(got).__module__.startswith("numpy"):
        _fail(f"{name} should be a {type(want).__name__} like {want!r}, "
              f"got a {type(got).__name__}.", hint)  # fmt: skip
    try:
        same = bool(got == want)
    except Exception:  # noqa: BLE001 - an answer that cannot be compared
        same = False
    if not same:
        _fail(f"{name} is {got!r}; expected {want!r}.", hint)


def expect_raises(
    error: type[BaseException],
    call: Callable[[], object],
    *,
    match: str | None = None,
    hint: str | None = None,
) -> None:
    """``call()`` raises ``error`` (whose message matches the regular
    expression ``match``, if given). A stub's ``NotImplementedError``
    is never credited as another error, though it is a RuntimeError."""
    try:
        call()
    except NotImplementedError as raised:
        if error is not NotImplementedError:
            raise
        _matches(error, raised, match, hint)
        return
    except error as raised:
        _matches(error, raised, match, hint)
        return
    except Exception as other:  # noqa: BLE001 - named in the message
        _fail(f"expected a {error.__name__}, got {type(other).__name__}: "
              f"{other}", hint)  # fmt: skip
    _fail(f"expected a {error.__name__}; nothing was raised.", hint)


def _matches(error, raised: BaseException, match, hint) -> None:
    if match is not None and not re.search(match, str(raised)):
        _fail(f"the {error.__name__} says {str(raised)!r}, which does "
              f"not match {match!r}.", hint)  # fmt: skip
