"""Checks on options, shared by every module: a bool is not an int, a
str is not a bool, and a message names the option (all chapters).

Python counts ``True`` as the int 1 and ``1.0`` equals ``1``; a model
built with ``n_layers=True`` or ``pad_id=1.0`` would run, and a typo
would surface much later as a raw torch error or as no error at all.
These checks run before any work starts.
"""

import math
import numbers

import torch

__all__ = ["check_bool", "check_heads", "check_int", "check_real"]

# A torch.SymInt stands for an int while torch.compile traces a graph.
INTEGERS = (numbers.Integral, torch.SymInt)


def check_int(
    name: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
) -> int:
    """``value`` if it is an int (not a bool) in [``low``, ``high``];
    else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, INTEGERS):
        kind = "a positive int" if low == 1 and high is None else "an int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if (low is not None and value < low) or (
        high is not None and value > high
    ):
        if high is None and low in (0, 1):
            kind = "a positive int" if low else "a non-negative int"
        else:
            kind = f"an int in [{'-inf' if low is None else low}, "
            kind += f"{'inf' if high is None else high}]"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    high_open: bool = False,
) -> float:
    """``value`` as a float if it is a finite real number (an int or a
    float, not a bool) in [``low``, ``high``] (``high`` excluded with
    ``high_open``); else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    too_high = high is not None and (
        value >= high if high_open else value > high
    )
    if (
        not math.isfinite(value)
        or (low is not None and value < low)
        or too_high
    ):
        close = ")" if high_open else "]"
        bounds = f"[{'-inf' if low is None else low}, "
        bounds += f"{'inf' if high is None else high}{close}"
        raise ValueError(
            f"{name} must be a finite number in {bounds}, got {value!r}"
        )
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool (not 0, 1 or a str such as "no")."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_heads(d_model: int, n_heads: int) -> None:
    """Raise a ``ValueError`` unless ``d_model`` splits into ``n_heads``
    heads of equal width (both already checked as positive ints)."""
    if d_model % n_heads:
        raise ValueError(
            f"d_model ({d_model}) must be divisible by n_heads ({n_heads})"
        )
