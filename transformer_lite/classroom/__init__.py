"""The classroom edition (the teaching page): checkers for the graded
exercises that close every chapter. Nothing in the book's package imports
this tier; the exercises do."""

from transformer_lite.classroom.grading import (
    WrongAnswer,
    expect,
    expect_close,
    expect_equal,
    expect_raises,
    expect_tensor,
)

__all__ = [
    "WrongAnswer",
    "expect",
    "expect_close",
    "expect_equal",
    "expect_raises",
    "expect_tensor",
]
