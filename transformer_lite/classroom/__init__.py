"""The classroom edition (the teaching page): checkers for the graded
exercises that close every chapter, and the syllabus (objectives,
prerequisites, measured times) that opens it. Nothing else in the
package imports this tier; the chapters do."""

from transformer_lite.classroom.exercises import (
    exercise,
    forbid,
    outcomes,
    watch,
)
from transformer_lite.classroom.grading import (
    WrongAnswer,
    expect,
    expect_close,
    expect_equal,
    expect_raises,
    expect_tensor,
)
from transformer_lite.classroom.syllabus import Chapter, chapter_card, syllabus

__all__ = [
    "Chapter",
    "WrongAnswer",
    "chapter_card",
    "exercise",
    "expect",
    "expect_close",
    "expect_equal",
    "expect_raises",
    "expect_tensor",
    "forbid",
    "outcomes",
    "syllabus",
    "watch",
]
