"""One graded exercise's check, as a student meets it.

A check cell wraps its checks in :func:`exercise`::

    with exercise("2.2", twins=[causal_mask], after=["2.1"]):
        expect_equal("make_causal_mask(5)", make_causal_mask(5),
                     causal_mask(5))

and the block gives the student these, which the bare checks do not:

- **No answer by delegation.** While the block runs, each of ``twins``
  (the package's own answer to the exercise, or a torch function the
  statement forbids) refuses to serve a function written in the notebook:
  ``make_causal_mask`` that returns ``causal_mask(L)`` fails with "exercise
  2.2 asks you to write this yourself". The check itself may still call
  the twin, to compute what it expects: a call is refused only when a
  function defined in the notebook (the student's) is on its way up the
  stack before the check's own code is.
- **Feedback in a few lines**: a wrong answer shows the exercise, what is
  wrong and the hint, not the checkers' frames; a stub (``raise
  NotImplementedError()``, which the student edition puts in every
  solution) says that the exercise is not done yet; a passing block says
  so in one line.
- **A missing name told as such**: a check that meets a name nobody
  defined yet (the student's function, or ``prediction``) says to run
  the cells above it first; ``prediction=True`` says, when the check
  passes, that a prediction is marked on handing in (its check is in
  nbgrader's hidden tests).
- **The cause, when it is an earlier exercise**: if the block fails and an
  exercise named in ``after`` did not pass, the message says to fix that
  one first (a correct answer never loses its point for an earlier one).
"""

import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from transformer_lite.classroom.grading import WrongAnswer

__all__ = ["exercise", "forbid", "outcomes", "watch"]

# What each exercise's last check said, in the order they ran: True for
# passed, False for wrong or not done. Read by :func:`exercise`'s ``after``.
_OUTCOMES: dict[str, bool] = {}
_COMPREHENSIONS = {"<listcomp>", "<genexpr>", "<setcomp>", "<dictcomp>"}


def outcomes() -> dict[str, bool]:
    """A copy of what each exercise checked so far said (True: passed)."""
    return dict(_OUTCOMES)


def _is_torch_callable(target: object) -> bool:
    """A function torch dispatches through ``__torch_function__``: a
    builtin (``torch.softmax``, ``Tensor.softmax``) or one of
    ``torch.nn.functional``'s Python functions."""
    if getattr(target, "__objclass__", None) is torch._C.TensorBase:
        return True
    module = getattr(target, "__module__", None) or ""
    return callable(target) and module.split(".")[0] == "torch"


def _name(target: object) -> str:
    """How a student would write ``target``: ``torch.softmax``,
    ``Tensor.softmax``, ``torch.nn.functional.layer_norm``,
    ``transformer_lite.masks.padding_mask``."""
    name = target.__name__
    if getattr(target, "__objclass__", None) is torch._C.TensorBase:
        return f"Tensor.{name}"
    module = target.__module__
    if module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    if module == "torch":
        return f"torch.{name}"
    return f"{module}.{target.__qualname__}"


@dataclass
class forbid:
    """While the block runs, each of ``twins`` refuses to serve code
    written in the notebook (see the module): a call raises
    :class:`WrongAnswer`, and so does leaving the block after any refused
    call, in case the answer caught the first error.

    ``twins`` are the package's functions and methods (``padding_mask``,
    ``MultiHeadAttention.forward``) or torch functions
    (``torch.softmax``, ``torch.Tensor.softmax``,
    ``torch.nn.functional.layer_norm``). A package function is replaced
    wherever a module holds it by name (the notebook's namespace
    included), a method on its class; a torch function is caught by a
    :class:`~torch.overrides.TorchFunctionMode`.

    Raises:
        TypeError: a twin that is neither a Python function nor a torch
            callable, or a method whose class cannot be found.
    """

    exercise: str
    twins: Iterable[object] = ()
    refused: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.twins = tuple(self.twins)
        self._python = []
        self._torch = set()
        for twin in self.twins:
            # a torch function written in Python (F.softmax, but also
            # nn.utils.clip_grad_norm_, which torch never dispatches) is
            # both replaced by name and watched by the mode
            if isinstance(twin, types.FunctionType):
                self._python.append(twin)
            if _is_torch_callable(twin):
                self._torch.add(twin)
            elif not isinstance(twin, types.FunctionType):
                raise TypeError(
                    f"forbid: a twin must be a function or a torch callable, "
                    f"got {type(twin).__name__} {twin!r}"
                )
        self._patched: list[tuple[object, str, object]] = []
        self._mode: TorchFunctionMode | None = None
        self._check_globals: dict | None = None

    # -- who is calling ---------------------------------------------------
    def _student_is_calling(self, frame: types.FrameType | None) -> bool:
        """Walking up from ``frame``: True if a function written in the
        notebook comes before the check's own code; library frames and
        comprehensions in between do not count."""
        while frame is not None:
            code = frame.f_code
            if frame.f_globals is self._check_globals:
                if code is self._check_code:
                    return False
                if code.co_name not in _COMPREHENSIONS:
                    return True
            frame = frame.f_back
        return False

    def _refuse(self, name: str) -> None:
        self.refused.append(name)
        raise WrongAnswer(
            f"exercise {self.exercise} asks you to write this yourself: "
            f"your answer calls {name}, the package's (or torch's) own "
            f"version of it.",
            exercise=self.exercise,
        )

    def _stand_in(self, original: Callable) -> Callable:
        name = _name(original)

        def stand_in(*args, **kwargs):
            if self._student_is_calling(sys._getframe(1)):
                self._refuse(name)
            return original(*args, **kwargs)

        stand_in.__wrapped__ = original
        stand_in.__name__ = original.__name__
        stand_in.__qualname__ = original.__qualname__
        return stand_in

    # -- entering and leaving ----------------------------------------------
    def _owner(self, function: types.FunctionType) -> object | None:
        """The class whose attribute ``function`` is, for a method."""
        parts = function.__qualname__.split(".")
        if len(parts) == 1:
            return None
        if "<locals>" in parts:
            raise TypeError(f"forbid: cannot reach {function.__qualname__}")
        owner = sys.modules.get(function.__module__)
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
        if not isinstance(owner, type):
            raise TypeError(f"forbid: no class holds {_name(function)}")
        return owner

    def _patch(self, holder: object, attribute: str, value: object) -> None:
        self._patched.append((holder, attribute, getattr(holder, attribute)))
        setattr(holder, attribute, value)

    def __enter__(self) -> "forbid":
        return self._enter(sys._getframe(1))

    def _enter(self, caller: types.FrameType) -> "forbid":
        """Start refusing; ``caller`` is the frame of the check's code."""
        self._check_globals = caller.f_globals
        self._check_code = caller.f_code
        self.refused.clear()
        for function in self._python:
            stand_in = self._stand_in(function)
            owner = self._owner(function)
            if owner is not None:
                self._patch(owner, function.__name__, stand_in)
                continue
            holders = [m for m in list(sys.modules.values()) if m is not None]
            for module in holders:
                names = getattr(module, "__dict__", {})
                for key, value in list(names.items()):
                    if value is function:
                        self._patch(module, key, stand_in)
            for key, value in list(self._check_globals.items()):
                if value is function:  # the notebook's own namespace
                    self._check_globals[key] = stand_in
                    self._patched.append((self._check_globals, key, function))
        if self._torch:
            self._mode = _Refusing(self)
            self._mode.__enter__()
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        __tracebackhide__ = True
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for holder, attribute, original in reversed(self._patched):
            if isinstance(holder, dict):
                holder[attribute] = original
            else:
                setattr(holder, attribute, original)
        self._patched.clear()
        if self.refused and not isinstance(error, WrongAnswer):
            names = ", ".join(sorted(set(self.refused)))
            raise WrongAnswer(
                f"exercise {self.exercise} asks you to write this yourself: "
                f"your answer called {names} (and caught the error).",
                exercise=self.exercise,
            ) from None
        return False


class _Refusing(TorchFunctionMode):
    """The torch half of :class:`forbid`."""

    def __init__(self, owner: forbid) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.owner._torch and self.owner._student_is_calling(
            sys._getframe(1)
        ):
            self.owner._refuse(_name(func))
        return func(*args, **(kwargs or {}))


@dataclass
class exercise:
    """The check of exercise ``number`` (see the module): ``twins``
    refused to the student's code, the stub and the wrong answer told in
    a few lines, the earlier exercises of ``after`` named when they may
    be the cause, and one line when every check passed."""

    number: str
    twins: Iterable[object] = ()
    after: Iterable[str] = ()
    quiet: bool = False
    prediction: bool = False  # a prediction, marked when handed in

    def __post_init__(self) -> None:
        self.after = tuple(str(n) for n in self.after)
        self._forbid = forbid(self.number, self.twins)

    def __enter__(self) -> "exercise":
        self._forbid._enter(sys._getframe(1))
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        __tracebackhide__ = True
        try:
            self._forbid.__exit__(kind, error, traceback)
        except WrongAnswer as refused:
            kind, error = WrongAnswer, refused
        if error is None:
            _OUTCOMES[self.number] = True
            if self.quiet:
                return False
            if self.prediction:
                print(f"Exercise {self.number}: prediction recorded; it "
                      "is marked when you hand the notebook in.")  # fmt: skip
            else:
                print(f"Exercise {self.number}: every check passed.")
            return False
        _OUTCOMES[self.number] = False
        if isinstance(error, NotImplementedError):
            raise WrongAnswer(
                f"exercise {self.number} is not done yet: its solution "
                "cell still raises NotImplementedError. Replace that line "
                "with your code and run the solution cell, then this one.",
                exercise=self.number,
            ) from None
        if isinstance(error, WrongAnswer):
            earlier = [n for n in self.after if not _OUTCOMES.get(n, False)]
            if earlier:
                first = ", ".join(earlier)
                raise WrongAnswer(
                    f"fix exercise {first} first: exercise {self.number} "
                    f"builds on it, and this check may fail because of it.\n"
                    f"{error.args[0] if error.args else ''}",
                    exercise=self.number,
                ) from None
            error.exercise = error.exercise or self.number
            raise error.with_traceback(None) from None
        if isinstance(error, NameError) and self._raised_here(traceback):
            raise WrongAnswer(
                f"exercise {self.number}: {error} (a NameError). Run the "
                "cells above this one first, your solution cell included.",
                exercise=self.number,
            ) from None
        return False  # another error: the student's own, shown in full

    def _raised_here(self, traceback) -> bool:
        """The error was raised by the check's own code (a name it uses
        is missing), not inside a function the student wrote."""
        while traceback.tb_next is not None:
            traceback = traceback.tb_next
        return traceback.tb_frame.f_code is self._forbid._check_code


class watch(TorchFunctionMode):
    """While on, records what every torch function returns, so that a
    check can test *how* an answer computes, not only what it returns::

        with watch() as seen:
            got = chunked_attention(Q, K, V, 7)
        expect(seen.largest <= 2 * block, "...")

    ``largest``: the most elements of any tensor made; ``shapes``: every
    shape made, in order; ``made_nan``: whether any floating result held a
    NaN (an answer that makes one and hides it afterwards included)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.shapes: list[tuple[int, ...]] = []
        self.made_nan = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                self.shapes.append(tuple(t.shape))
                if t.is_floating_point() and not self.made_nan:
                    self.made_nan = bool(torch.isnan(t).any())
        return out
