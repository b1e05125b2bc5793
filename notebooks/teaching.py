# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Teaching with this book
#
# This page is for the teacher who wants to run a course on the
# Transformer from these chapters: a one-week intensive or a two-week
# module, with lectures from the text, labs from the notebooks, and
# graded work that a machine marks. It says who the book is for, gives
# both plans with times measured on the book itself, and explains how
# to hand out and grade the exercises with nbgrader, on a JupyterHub or
# on laptops with no network.
#
# ## Who it is for
#
# Students who can program in Python and have met matrices, the
# exponential and a gradient: a second-year computer-science or
# engineering undergraduate, a graduate student from another field, an
# engineer who uses Transformers and wants to know what is inside.
# PyTorch experience helps but is not assumed; chapter 1 uses nothing
# but tensors and `@`. No GPU is needed at any point: every chapter runs
# on a laptop's CPU, the longest in a few minutes.
#
# Every chapter opens with a card: what a student can do after it (each
# objective is something an exercise or an exam question can test),
# what to read first, and how long it takes. The table below collects
# them. Reading time is estimated from the source (200 words of prose
# and 20 lines of code a minute); running time is measured, the seconds
# the test suite took to execute the chapter on one CPU core.

# %% tags=["remove-input"]
from pathlib import Path

import jupytext
import pandas as pd

from transformer_lite.classroom import syllabus

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def points(cell) -> int:
    """A graded cell's points: its points-N tag, or 1."""
    tags = cell.metadata.get("tags", [])
    return next((int(t[7:]) for t in tags if t.startswith("points-")), 1)


def graded_work(path: Path) -> tuple[list[int], list[int]]:
    """The chapter's graded exercises: the non-blank lines of each one's
    reference solution (its cell tagged "solution", between each pair
    of solution markers: a cell with two or three functions has a pair
    in each), and the points of each written question (its answer cell
    tagged "written")."""
    lines, written = [], []
    for cell in jupytext.read(path).cells:
        tags = cell.metadata.get("tags", [])
        if "solution" in tags:
            bodies = [part.split(END, 1)[0]
                      for part in cell.source.split(BEGIN)[1:]]  # fmt: skip
            lines.append(sum(1 for body in bodies
                             for x in body.splitlines() if x.strip()))
        elif "written" in tags:
            written.append(points(cell))
    return lines, written


chapters = syllabus()
work = {int(p.name[:2]): graded_work(p)
        for p in sorted(Path().glob("[0-9][0-9]_*.py"))
        if int(p.name[:2]) in chapters}  # fmt: skip
solutions = {n: lines for n, (lines, _) in work.items()}
written = {n: marks for n, (_, marks) in work.items()}
exercises = {n: len(solutions[n]) + len(written[n]) for n in work}
table = pd.DataFrame(
    {
        "objectives": [len(c.objectives) for c in chapters.values()],
        "read first": [", ".join(map(str, c.chapters)) or "-"
                       for c in chapters.values()],  # fmt: skip
        "reading (min)": [c.reading_minutes for c in chapters.values()],
        "running (s)": [c.running_seconds for c in chapters.values()],
        "graded exercises": [exercises[n] for n in chapters],
        "written": [len(written[n]) for n in chapters],
        "longest solution (lines)": [max(solutions[n]) for n in chapters],
    },
    index=pd.Index(list(chapters), name="chapter"),
)
assert all(3 <= n <= 5 for n in table["objectives"])
assert all(n >= 5 for n in table["graded exercises"])
assert all(n >= 1 for n in table["written"])  # every chapter asks one
lengths = sorted(x for lines in solutions.values() for x in lines)
assert lengths[0] == 1 and lengths[-1] == 31  # as the text says
assert solutions[7][1] == 31  # chapter 7's byte-pair encoding (7.2)
assert solutions[7][5] == 19  # and its beam search (7.6)
assert sum(x <= 5 for x in lengths) >= len(lengths) / 2  # "half"
table

# %% [markdown]
# ## Two plans
#
# A **session** is a lecture (the chapter's text, with its figures
# shown live), then a lab: the students run the chapter, change what
# its "Exercises" section suggests, and then do its graded exercises.
# The lecture time is the reading time. The lab time adds to the running
# time an estimate for each graded exercise from its length: **5 minutes
# plus 1 minute per line of its reference solution** (5 to read the
# statement and the check, then a minute a line to write and debug), so
# a two-line exercise (or a prediction, one line) gets 7 minutes (or 6)
# and the longest, chapter 7's byte-pair encoding, 36; a written question
# gets **5 minutes plus 5 per point**, 15 for the usual two. The
# graded work is the assignments of the chapters covered, handed in at
# the end of each day. The last column adds lecture and lab: the
# minutes the day holds.

# %% tags=["remove-input"]
ONE_WEEK = [  # (day, chapters)
    ("Mon", [1, 2, 3]),
    ("Tue", [4, 5, 6]),
    ("Wed", [7, 8]),
    ("Thu", [9, 10, 11]),
    ("Fri", [12, 13, 14]),
]
TWO_WEEKS = [
    ("Week 1, Mon", [1, 2]),
    ("Tue", [3]),
    ("Wed", [4]),
    ("Thu", [5]),
    ("Fri", [6]),
    ("Week 2, Mon", [7]),
    ("Tue", [8, 9]),
    ("Wed", [10, 11]),
    ("Thu", [12, 13]),
    ("Fri", [14]),
]
MINUTES_PER_EXERCISE = 5  # to read the statement and its check
MINUTES_PER_SOLUTION_LINE = 1  # to write and debug each line
MINUTES_PER_WRITTEN_POINT = 5  # to think and write what earns a point


def exercise_minutes(lines: int) -> int:
    """The lab time of a graded exercise whose solution has ``lines``."""
    return MINUTES_PER_EXERCISE + MINUTES_PER_SOLUTION_LINE * lines


def written_minutes(marks: int) -> int:
    """The lab time of a written question worth ``marks`` points."""
    return MINUTES_PER_EXERCISE + MINUTES_PER_WRITTEN_POINT * marks


def plan(days: list[tuple[str, list[int]]]) -> pd.DataFrame:
    rows = []
    for day, numbers in days:
        lecture = sum(chapters[n].reading_minutes for n in numbers)
        run = sum(chapters[n].running_seconds for n in numbers) / 60
        graded = sum(exercise_minutes(lines) for n in numbers
                     for lines in solutions[n])  # fmt: skip
        graded += sum(written_minutes(m) for n in numbers for m in written[n])
        lab = round(run + graded)
        rows.append({
            "day": day,
            "chapters": ", ".join(map(str, numbers)),
            "lecture (min)": lecture,
            "lab (min)": lab,
            "graded work": f"{sum(exercises[n] for n in numbers)} exercises",
            "day (min)": lecture + lab,
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("day")


one, two = plan(ONE_WEEK), plan(TWO_WEEKS)
for days in (ONE_WEEK, TWO_WEEKS):  # every chapter, once, in order
    assert [n for _, numbers in days for n in numbers] == sorted(chapters)
# as the text below says, in hours
assert one["lecture (min)"].between(120, 185).all()  # 2 to 3
assert one["lab (min)"].between(225, 315).all()  # 3 3/4 to 5 1/4
assert one["day (min)"].between(345, 495).all()  # 5 3/4 to 8 1/4
assert two["day (min)"].between(105, 375).all()  # 1 3/4 to 6 1/4
assert exercise_minutes(2) == 7 and exercise_minutes(max(lengths)) == 36
assert written_minutes(2) == 15

# %% [markdown]
# ### One week: five days

# %% tags=["remove-input"]
one

# %% [markdown]
# ### Two weeks: ten days

# %% tags=["remove-input"]
two

# %% [markdown]
# The one-week plan is dense: its days hold about two to three hours of
# lecture and three and three-quarter to five and a quarter hours of lab, five
# and three-quarter to eight and a quarter hours in all, which suits a summer
# school or a company course where the students do nothing else (or one that
# leaves the written questions for the evening). Chapters 7 and 9 to 13 are the
# heavy ones to run (they train models for minutes), so start them at the
# beginning of the lab.
# The two-week plan, one and three-quarter to six and a quarter hours a day,
# gives the first week to the foundations (attention to training, chapters 1
# and 2 together on its first day), and lets the second week go deeper into
# translation, speed, the applications, and pretraining and a domain's own
# data. In either plan a final project fits well: take chapter
# 7's translator to a new pair of languages of numbers, or chapter 10's model
# to a new corpus, and
# report by slice.
#
# ## The graded exercises
#
# Every chapter ends with **graded exercises**: at least five, each one to
# three short functions (a masked softmax, a head split, RoPE, a beam-search
# step, attention in chunks). Their reference solutions run from one line to 31
# (chapter 7's byte-pair encoding, three functions; its beam search, in one,
# has 19), and half of them are five lines or fewer: exercises, not projects.
# Each has a reference solution, folded in the book, and one or more checks
# whose failure says what is wrong: the shape, a NaN, the largest difference
# and where, and a hint about the likely mistake. Beside them, every chapter
# asks at least one **prediction**, where the student commits to a number or
# a choice before a cell runs the experiment (nbgrader marks the prediction
# in a hidden test), and one **written question**, marked by hand in
# nbgrader's formgrader against the rubric that the instructor version gives
# with a model answer (folded in the book too).
#
# The checks grade the work, not only its result. While a check runs, the
# package's own version of what the exercise asks (its *twin*:
# `padding_mask` for exercise 2.1, `torch.softmax` where the statement
# forbids it) refuses to serve the student's code, so an answer that hands
# the work to it scores nothing; where a part is asked for, the checks
# compare that part. A check says in one line that it passed, tells a stub
# that its exercise is not done yet, and names the earlier exercise to fix
# first when one it builds on failed. `syllabus.json` maps every exercise
# to the chapter's objectives it tests, and every objective is tested.
#
# The exercises are written once, in the chapter; `make assignments` cuts
# them out into one assignment per chapter and asks
# [nbgrader](https://nbgrader.readthedocs.io) for the student edition,
# with every solution replaced by a stub and every hidden test removed:
#
# ```bash
# make assignments
# ls _build/classroom/source/ch01    # the instructor version
# ls _build/classroom/release/ch01   # the student edition
# python tools/assignments.py --table   # what each asks, and its scores
# ```
#
# The test suite runs nbgrader on every chapter's assignment five times.
# The instructor version scores full marks (but for the written answers,
# which wait for a teacher); the student edition handed in untouched
# scores zero, and the grader does not crash; a version with one typical
# mistake planted loses that exercise's points with the message its
# author wrote for that mistake; and two versions of cheats score zero on
# every exercise they cheat: one where each exercise that has a twin
# delegates to it, and one where each answer is something trivially
# related (zeros, the input, the whole model where a part is asked).
#
# ### On a JupyterHub
#
# nbgrader is Project Jupyter's own tool for grading notebooks, with an
# extension that hands assignments out and collects them on a JupyterHub.
# Install the book's requirements (they pin nbgrader with the rest of
# the Jupyter stack) and the package in the hub's user image, then, in
# the course directory `_build/classroom`:
#
# ```bash
# nbgrader release_assignment ch01          # to the students' list
# nbgrader collect ch01                     # after the deadline
# nbgrader autograde ch01                   # runs every check
# nbgrader generate_feedback ch01           # the marked notebooks
# ```
#
# The students fetch, work and submit from the Assignments tab. Set the
# hub's exchange directory and course id as nbgrader's documentation
# describes; the course id used here is `transformer-lite`. The test suite
# runs these four commands as they are written here, in this order, with
# a student's fetch and submit between them, on a course folder and an
# exchange of its own: the work handed in scores full marks and its
# feedback page says so.
#
# ### On laptops, offline
#
# Nothing in the book needs a network once it is installed: the data is
# generated or shipped, and the HTML book serves its own MathJax, charts
# and slides. For a class, `make student-kit` writes `_build/student-kit`:
# the student edition, the package as a wheel, the pinned requirements
# without the developers' tools, and a `README.txt` with the steps. Where
# a network is at hand, download the pinned packages into its `wheels/`
# folder once (`pip download -r requirements.txt -d wheels`); then copy
# the kit to each laptop, where it installs with no network, and the
# students open `assignments/` in JupyterLab (`make student-lab` shows
# what they see). The kit holds no reference solution, hidden test or
# rubric, and the students never need the book's sources, which hold
# them all. They hand in their notebooks on a USB stick or the course's
# file share; `nbgrader autograde` marks them on the teacher's laptop, as
# above, after they are copied under `submitted/<student>/<chNN>/`. The
# browser test opens the kit in JupyterLab, offline, and runs the cells
# from the top with Shift+Enter as a student would, up to the first check.
#
# ## Slides
#
# Each chapter has a slide deck, cut from the executed chapter by
# `make slides`: a title slide with the objectives, one slide per
# section with its display equations, the section's figures below it
# (press the down arrow), and the summary. No slide is kept by hand, so
# the decks change when the chapters do. They run offline, with the
# book's own copies of reveal.js and MathJax; press `F` for full screen
# and `O` for an overview of the slides.

# %% tags=["remove-input"]
from IPython.display import HTML

decks = sorted(p.stem for p in Path().glob("[0-9][0-9]_*.py")
               if int(p.name[:2]) in chapters)  # fmt: skip
items = "".join(f'<li><a href="slides/{stem}.html">{stem}</a></li>'
                for stem in decks)  # fmt: skip
HTML(f'<ul class="slide-decks">{items}</ul>')
