"""What each chapter teaches, what it needs, and how long it takes (the
teaching page and the card at the top of every chapter).

The objectives and prerequisites are written by hand in
``syllabus.json``; the times in ``timings.json`` are measured by
``tools/chapter_times.py``: reading at 200 words of prose and 20 lines of
code a minute, counted in the chapter's source, and running as nbval ran
the chapter on two CPU cores (``make nbval``, one chapter per core).
"""

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["Chapter", "chapter_card", "syllabus"]

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Chapter:
    """One chapter's entry of the syllabus."""

    number: int
    objectives: tuple[str, ...]  # 3-5, each one a student can be tested on
    chapters: tuple[int, ...]  # the chapters to read first
    maths: str  # the mathematics it assumes
    reading_minutes: int  # estimated from the source, see the module
    running_seconds: int  # measured: nbval, one chapter per CPU core
    # exercise K (1-based, in the chapter's order) -> the 1-based numbers
    # of the objectives it tests
    exercises: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def tested_by(self, objective: int) -> tuple[int, ...]:
        """The exercises that test objective ``objective`` (1-based)."""
        return tuple(k for k, goals in self.exercises.items()
                     if objective in goals)  # fmt: skip


@cache
def syllabus() -> dict[int, Chapter]:
    """Every chapter's entry, by number."""
    written = json.loads((HERE / "syllabus.json").read_text())
    measured = json.loads((HERE / "timings.json").read_text())
    return {
        int(key): Chapter(
            int(key),
            tuple(entry["objectives"]),
            tuple(int(c) for c in entry["chapters"]),
            entry["maths"],
            measured[key]["reading_minutes"],
            measured[key]["running_seconds"],
            _exercises(key, entry),
        )
        for key, entry in written.items()
    }


def _exercises(key: str, entry: dict) -> dict[int, tuple[int, ...]]:
    """Chapter ``key``'s map from exercises to objectives, checked: every
    objective number names one of the chapter's objectives."""
    mapped = {}
    for exercise, goals in entry.get("exercises", {}).items():
        goals = tuple(goals)
        bad = [g for g in goals if not 1 <= g <= len(entry["objectives"])]
        if bad or not goals:
            raise ValueError(
                f"syllabus.json, chapter {key}, exercise {exercise}: "
                f"objectives {list(goals)}; the chapter has "
                f"{len(entry['objectives'])}, numbered from 1"
            )
        mapped[int(exercise)] = goals
    return mapped


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 \
        else "".join(items)  # fmt: skip


def chapter_card(number: int):
    """The card at the top of chapter ``number``: objectives,
    prerequisites and times, as Markdown for the notebook to show."""
    from IPython.display import Markdown

    entry = syllabus().get(number)
    if entry is None:
        raise ValueError(f"no chapter {number} in the syllabus: "
                         f"{sorted(syllabus())}")  # fmt: skip
    goals = "\n".join(f"- {goal}" for goal in entry.objectives)
    first = (f"chapters {_and([str(c) for c in entry.chapters])}"
             if len(entry.chapters) > 1 else
             f"chapter {entry.chapters[0]}" if entry.chapters else
             "no earlier chapter")  # fmt: skip
    s = entry.running_seconds
    run = f"{s} seconds" if s < 120 else f"{s / 60:.1f} minutes"
    return Markdown(
        f"**After this chapter you can:**\n\n{goals}\n\n"
        f"**Before it:** {first}; {entry.maths}.\n\n"
        f"**Time:** about {entry.reading_minutes} minutes to read; "
        f"{run} to run on one CPU core (measured).\n"
    )
