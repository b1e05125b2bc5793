"""Build the classroom edition's assignments from the chapters (nbgrader).

Every chapter ends with a section ``## Graded exercises``, authored once in
its jupytext source and executed with the chapter (so nbval proves every
reference solution passes its checks). Its cells have roles, given by tags:

* ``exercise-setup``: code the exercises need (imports, small inputs);
  read-only in the assignment.
* untagged markdown: the statements; read-only.
* ``solution``: the reference solution, a function whose body holds
  ``### BEGIN SOLUTION`` ... ``### END SOLUTION``; nbgrader replaces that
  region by a stub that raises ``NotImplementedError``. One per exercise,
  numbered in order: exercise 1, 2, ...
* ``check``: a graded check of the exercise above it, worth one point,
  or N with a ``points-N`` tag; read-only.
* ``prediction``, a second tag on a solution cell: the exercise asks the
  student to commit to a number or a choice (``prediction = ...``)
  before the cell below runs the experiment; its check grades the
  prediction within a tolerance or against the choice.
* ``written``: a markdown cell after a written question's statement,
  holding a model answer and the rubric, in a MyST dropdown (folded in
  the book). In the assignment it becomes the student's answer cell,
  graded by hand (``points-N``, default 1): the instructor version keeps
  the model answer and the rubric, the student edition says ``YOUR
  ANSWER HERE``. A written question counts as an exercise with no check.
* ``planted``: a raw cell, never run nor shown, that holds a wrong answer
  for the tests: a first line ``exercise: K``, a second line
  ``message: TEXT`` (what the failed check must say), then the code
  that replaces exercise K's solution cell. (jupytext writes a raw
  cell's lines behind ``# ``.)
* ``cheat``: a raw cell like ``planted``, with ``kind: delegate`` or
  ``kind: trivial`` as its second line: an answer that earns nothing
  (one that hands the work to the package's own twin, or returns a
  trivially related tensor: the input, zeros of the right shape, the
  whole where a part is asked). The tests grade every cheat and require
  zero points for its exercise.

Every check runs inside ``with exercise("C.K", twins=[...], ...)``
(:mod:`transformer_lite.classroom.exercises`), C the chapter and K the
exercise: the twins it names (what would answer the exercise for the
student) are read from there, and written into the check cell's
metadata (``transformer_lite.twins``) for the tests.

This script cuts that section out of each chapter, writes it as an nbgrader
source notebook with the metadata nbgrader reads, and has nbgrader generate
the student edition (solutions removed):

    _build/classroom/source/chNN/chNN.ipynb    instructor version
    _build/classroom/release/chNN/chNN.ipynb   student edition

Run: ``.venv/bin/python tools/assignments.py`` (``make assignments`` does);
``--chapters 01 03`` builds some only. ``--kit DIR`` (``make student-kit``)
also writes what a class on laptops without a network needs, and nothing a
student should not see: the student edition, the package as a wheel, the
pinned requirements without the developers' tools, and how to install and
start (``README.txt``).
"""

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COURSE = ROOT / "_build" / "classroom"
SECTION = "## Graded exercises"
ROLES = ("exercise-setup", "solution", "check", "planted", "cheat", "written")
CHEATS = ("delegate", "trivial")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CONFIG = """c = get_config()  # noqa: F821 - nbgrader's config loader
c.CourseDirectory.course_id = "transformer-lite"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
c.Execute.timeout = 120  # seconds per cell
"""


@dataclass
class Planted:
    """A wrong answer to one exercise and what its check must say."""

    exercise: int  # 1-based
    message: str
    code: str


@dataclass
class Cheat:
    """An answer to one exercise that must earn no points."""

    exercise: int  # 1-based
    kind: str  # one of CHEATS
    code: str


@dataclass
class Check:
    """What one check cell declares: the exercise it checks (as written
    in its ``exercise(...)`` block, None if it has none) and the twins
    it refuses to the student's code."""

    exercise: int  # 1-based, the exercise above the cell
    number: str | None  # "C.K"
    twins: tuple[str, ...]


@dataclass
class Assignment:
    """One chapter's graded exercises, as nbgrader source cells."""

    name: str  # chNN
    title: str  # the chapter's title
    cells: list = field(default_factory=list)
    points: int = 0
    exercises: int = 0
    planted: Planted | None = None
    cheats: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    predictions: int = 0  # exercises tagged "prediction"
    written: int = 0  # written questions, graded by hand
    manual_points: int = 0  # their points (not in ``points``)

    def twins(self, exercise: int) -> tuple[str, ...]:
        """The twins that exercise ``exercise``'s checks name."""
        names = [t for c in self.checks if c.exercise == exercise
                 for t in c.twins]  # fmt: skip
        return tuple(dict.fromkeys(names))


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def role(cell) -> str | None:
    found = tags(cell) & set(ROLES)
    if len(found) > 1:
        raise ValueError(f"a cell has two roles {sorted(found)}: "
                         f"{cell.source[:60]!r}")  # fmt: skip
    return found.pop() if found else None


def points(cell) -> int:
    for tag in tags(cell):
        if match := re.fullmatch(r"points-(\d+)", tag):
            return int(match.group(1))
    return 1


def graded_section(path: Path) -> tuple[str, list]:
    """The chapter's title and the cells of its graded section."""
    notebook = jupytext.read(path)
    title = notebook.cells[0].source.splitlines()[0].lstrip("# ").strip()
    start = None
    for i, cell in enumerate(notebook.cells):
        first = cell.source.lstrip().splitlines()[:1]
        heading = first[0].strip() if first else ""
        if cell.cell_type != "markdown":
            continue
        if heading == SECTION:
            start = i
        elif start is not None and re.match(r"## \S", heading):
            return title, notebook.cells[start:i]
        elif start is not None and "\n## " in "\n" + cell.source:
            raise ValueError(f"{path.name}: a heading inside a cell")
    if start is None:
        raise ValueError(f"{path.name}: no {SECTION!r} section")
    return title, notebook.cells[start:]


# The sentence every section opens with for the book's readers; a student
# holding the assignment has no folded solutions and is in the classroom.
FOR_READERS = re.compile(
    r"\s*In the book the reference solutions are folded: try first, then "
    r"open them\. The classroom edition \(the teaching page\) hands out the "
    r"same exercises (?:with the solutions removed|without the solutions), "
    r"and nbgrader scores them\."
)
HOW_TO = (
    "Fill in every cell that says `YOUR CODE HERE` (delete the "
    "`raise NotImplementedError()`). Run the cells one at a time, from "
    "the top, with Shift+Enter: each check below an exercise says in "
    "one line that it passed, or what is wrong and a hint. *Run All* "
    "stops at the first check that fails, so use it only to run what "
    "you have finished; the *Validate* button runs every check and "
    "lists the ones that fail. The read-only cells cannot be changed."
)


def for_students(source: str) -> str:
    """The section's opening text without the book readers' sentence
    (the tests check that nothing of it is left)."""
    heading, *lines = source.splitlines()
    flat = " ".join(line.strip() for line in lines)
    return heading + "\n\n" + FOR_READERS.sub("", flat).strip() + "\n"


DROPDOWN = re.compile(r"^(```+|:::+)\{dropdown\}.*$|^(```+|:::+)$", re.M)


def written_answer(source: str) -> str:
    """A ``written`` cell's model answer and rubric, without the dropdown
    that folds them in the book, between nbgrader's solution markers
    (which the student edition replaces by ``YOUR ANSWER HERE``)."""
    body = DROPDOWN.sub("", source).strip()
    return f"{BEGIN}\n\n{body}\n\n{END}"


def meta(grade_id: str, **flags) -> dict:
    nbgrader = dict(grade=False, locked=True, solution=False, task=False)
    nbgrader.update(flags, grade_id=grade_id, schema_version=3)
    return {"nbgrader": nbgrader}


def parse_head(source: str, keys: tuple[str, str], role: str, path: Path):
    """A raw cell's two ``key: value`` lines (as planted and cheat cells
    start), and the code below them."""
    lines = source.splitlines()
    pattern = rf"({'|'.join(keys)}): (.+)"
    head = [re.fullmatch(pattern, x) for x in lines[:2]]
    if not all(head) or tuple(m.group(1) for m in head) != keys:
        raise ValueError(f"{path.name}: a {role} cell starts with "
                         f"'{keys[0]}: ...' and '{keys[1]}: ...'")  # fmt: skip
    values = [m.group(2).strip() for m in head]
    return *values, "\n".join(lines[2:]).strip() + "\n"


def parse_planted(source: str, path: Path) -> Planted:
    exercise, message, code = parse_head(
        source, ("exercise", "message"), "planted", path
    )
    return Planted(int(exercise), message, code)


def parse_cheat(source: str, path: Path) -> Cheat:
    exercise, kind, code = parse_head(
        source, ("exercise", "kind"), "cheat", path
    )
    if kind not in CHEATS:
        raise ValueError(f"{path.name}: a cheat's kind is one of {CHEATS}, "
                         f"not {kind!r}")  # fmt: skip
    return Cheat(int(exercise), kind, code)


def parse_check(source: str, exercise: int, path: Path) -> Check:
    """The ``exercise("C.K", twins=[...])`` block of a check cell."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if (isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "exercise"):  # fmt: skip
                found.append(call)
    if not found:
        return Check(exercise, None, ())
    if len(found) > 1:
        raise ValueError(f"{path.name}: one exercise(...) block a check")
    call = found[0]
    if not call.args or not isinstance(call.args[0], ast.Constant):
        raise ValueError(f"{path.name}: exercise(...) names its number "
                         "as a string first")  # fmt: skip
    twins = ()
    for keyword in call.keywords:
        if keyword.arg == "twins":
            if not isinstance(keyword.value, (ast.List, ast.Tuple)):
                raise ValueError(f"{path.name}: twins=[...] is a list")
            twins = tuple(ast.unparse(e) for e in keyword.value.elts)
    return Check(exercise, str(call.args[0].value), twins)


def assignment(path: Path) -> Assignment:
    """Chapter ``path``'s graded section as an nbgrader source notebook."""
    name = "ch" + path.name[:2]
    title, cells = graded_section(path)
    job = Assignment(name, title)
    v4 = nbformat.v4
    job.cells.append(v4.new_markdown_cell(
        f"# {title}: graded exercises\n\n{HOW_TO}",
        metadata=meta(f"{name}-title"),
    ))  # fmt: skip
    checks_of_last = None
    cells = [cells[0].copy(), *cells[1:]]
    cells[0].source = for_students(cells[0].source)
    for cell in cells:
        kind = role(cell)
        if kind == "planted":
            if cell.cell_type != "raw" or job.planted is not None:
                raise ValueError(f"{path.name}: one raw planted cell")
            job.planted = parse_planted(cell.source, path)
            continue
        if kind == "cheat":
            if cell.cell_type != "raw":
                raise ValueError(f"{path.name}: a cheat cell is a raw cell")
            job.cheats.append(parse_cheat(cell.source, path))
            continue
        source = cell.source
        if kind == "written":
            if cell.cell_type != "markdown":
                raise ValueError(f"{path.name}: a written answer is markdown")
            if checks_of_last == 0:
                raise ValueError(f"{path.name}: exercise {job.exercises} "
                                 "has no check")  # fmt: skip
            job.exercises += 1
            job.written += 1
            checks_of_last = None  # a written question has no check
            worth = points(cell)
            job.manual_points += worth
            gid = f"{name}-ex{job.exercises}-written"
            flags = dict(solution=True, grade=True, locked=False,
                         points=worth)  # fmt: skip
            job.cells.append(v4.new_markdown_cell(
                written_answer(source), metadata=meta(gid, **flags)
            ))  # fmt: skip
        elif cell.cell_type == "markdown":
            gid = f"{name}-text-{len(job.cells)}"
            job.cells.append(v4.new_markdown_cell(source, metadata=meta(gid)))
        elif kind == "solution":
            if BEGIN not in source or END not in source:
                raise ValueError(f"{path.name}: a solution cell needs "
                                 f"{BEGIN!r} and {END!r}")  # fmt: skip
            if checks_of_last == 0:
                raise ValueError(f"{path.name}: exercise {job.exercises} "
                                 "has no check")  # fmt: skip
            job.exercises += 1
            job.predictions += "prediction" in tags(cell)
            checks_of_last = 0
            gid = f"{name}-ex{job.exercises}"
            flags = dict(solution=True, locked=False)
            job.cells.append(
                v4.new_code_cell(source, metadata=meta(gid, **flags))
            )
        elif kind == "check":
            if checks_of_last is None:
                raise ValueError(f"{path.name}: a check before any solution")
            checks_of_last += 1
            gid = f"{name}-ex{job.exercises}-check{checks_of_last}"
            worth = points(cell)
            job.points += worth
            flags = dict(grade=True, points=worth)
            check = parse_check(source, job.exercises, path)
            job.checks.append(check)
            metadata = meta(gid, **flags)
            metadata["transformer_lite"] = {"twins": list(check.twins)}
            job.cells.append(v4.new_code_cell(source, metadata=metadata))
        else:  # exercise-setup, or any code the section shows
            gid = f"{name}-code-{len(job.cells)}"
            job.cells.append(v4.new_code_cell(source, metadata=meta(gid)))
    if checks_of_last == 0:
        raise ValueError(f"{path.name}: the last exercise has no check")
    planted = job.planted
    if planted is not None and not 1 <= planted.exercise <= job.exercises:
        raise ValueError(f"{path.name}: planted exercise {planted.exercise} "
                         f"of {job.exercises}")  # fmt: skip
    kinds = [(cheat.exercise, cheat.kind) for cheat in job.cheats]
    if len(set(kinds)) < len(kinds):
        raise ValueError(f"{path.name}: two cheats of one kind for one "
                         "exercise")  # fmt: skip
    for cheat in job.cheats:
        if not 1 <= cheat.exercise <= job.exercises:
            raise ValueError(f"{path.name}: a cheat for exercise "
                             f"{cheat.exercise} of "
                             f"{job.exercises}")  # fmt: skip
    return job


def chapters(selected: list[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    paths = [p for p in paths if not p.name.startswith("00")]
    if selected:
        paths = [p for p in paths if p.name[:2] in selected]
    return paths


def write_source(job: Assignment, course: Path) -> Path:
    notebook = nbformat.v4.new_notebook(cells=job.cells)
    notebook.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }  # fmt: skip
    out = course / "source" / job.name / f"{job.name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out)
    return out


def build(paths: list[Path], course: Path = COURSE) -> list[Assignment]:
    """Write every source notebook and generate the student edition."""
    from nbgrader.apps import NbGraderAPI

    jobs = [assignment(p) for p in paths]
    shutil.rmtree(course / "source", ignore_errors=True)
    shutil.rmtree(course / "release", ignore_errors=True)
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    for job in jobs:
        write_source(job, course)
    api = NbGraderAPI(config=course_config(course))
    for job in jobs:
        result = api.generate_assignment(job.name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(
                f"nbgrader could not generate {job.name}:\n"
                f"{result['error']}\n{result['log']}"
            )
    return jobs


KIT_README = """\
transformer-lite: the graded exercises, student edition
=======================================================

assignments/chNN/chNN.ipynb   one notebook per chapter, to fill in
wheels/                       the transformer_lite package (and, once
                              the teacher has downloaded them, every
                              pinned package: see below)
requirements.txt              the versions the notebooks were tested with

Once, where a network is at hand (the teacher, for the whole class):

    python3 -m pip download -r requirements.txt -d wheels

Then on each laptop, with no network needed (Python 3.10 or later):

    python3 -m venv .venv
    .venv/bin/pip install --no-index --find-links wheels \\
        -r requirements.txt wheels/transformer_lite-*.whl
    .venv/bin/jupyter lab assignments

(On Windows: .venv\\Scripts\\pip and .venv\\Scripts\\jupyter.)
Open a chapter's notebook, fill in every cell that says YOUR CODE
HERE and run the cells one at a time with Shift+Enter: each check says
whether your answer passed, and what is wrong if not. Hand in the
notebook as your teacher asks (a file share, a USB stick).
"""
DEVELOPERS = "# Tests, lint and the book"  # requirements.txt's tail


def kit(course: Path, out: Path) -> Path:
    """The student kit in ``out`` (see the module), from ``course``'s
    student edition."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(course / "release", out / "assignments")
    pins = (ROOT / "requirements.txt").read_text()
    if DEVELOPERS not in pins:
        raise ValueError(f"requirements.txt has no line {DEVELOPERS!r}")
    (out / "requirements.txt").write_text(pins.split(DEVELOPERS)[0])
    (out / "README.txt").write_text(KIT_README)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--no-build-isolation", "--wheel-dir", str(out / "wheels"),
         str(ROOT)],
        capture_output=True, text=True,
    )  # fmt: skip
    if built.returncode:
        raise RuntimeError(f"pip could not build the wheel:\n{built.stderr}")
    return out


def course_config(course: Path):
    """nbgrader's settings for the course folder ``course``. nbgrader
    runs ``alembic`` (its database migrations) as a program: the
    environment's own, even when the environment is not activated."""
    from traitlets.config import Config

    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")

    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "transformer-lite"
    config.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
    config.Execute.timeout = 120
    return config


GRADES = ROOT / "_build" / "classroom-grades"  # chNN.json: tests write them


def table(jobs: list[Assignment]) -> str:
    """A Markdown table of the assignments: what each asks, its cheats
    and, when the tests have graded them (GRADES), every version's
    score."""
    import json

    grades = {
        f"{path.stem} {version}": score
        for path in sorted(GRADES.glob("ch*.json"))
        for version, score in json.loads(path.read_text()).items()
    }
    versions = ("instructor", "student", "planted", *CHEATS)
    rows = [
        "| chapter | exercises | predictions | written | points (auto + "
        "by hand) | cheats (delegate, trivial) | "
        + " | ".join(versions) + " |",
        "|" + "---|" * (6 + len(versions)),
    ]
    for job in jobs:
        kinds = [sum(c.kind == k for c in job.cheats) for k in CHEATS]
        scores = []
        for version in versions:
            got = grades.get(f"{job.name} {version}")
            scores.append(f"{got[0]:g}" if got else "")
        rows.append(
            f"| {job.name} | {job.exercises} | {job.predictions} | "
            f"{job.written} | {job.points} + {job.manual_points} | "
            f"{kinds[0]}, {kinds[1]} | " + " | ".join(scores) + " |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chapters", nargs="*", help="e.g. 01 03")
    parser.add_argument("--course", type=Path, default=COURSE)
    parser.add_argument("--kit", type=Path, help="write the student kit")
    parser.add_argument("--table", action="store_true",
                        help="print what each assignment asks and, from "
                        "the last test run, its scores (builds nothing)")
    args = parser.parse_args(argv)
    if args.table:
        print(table([assignment(p) for p in chapters(args.chapters)]))
        return 0
    jobs = build(chapters(args.chapters), args.course)
    for job in jobs:
        print(f"{job.name}: {job.exercises} exercises, {job.points} points "
              f"-- {job.title}")  # fmt: skip
    print(f"student edition: {args.course / 'release'}")
    if args.kit:
        out = kit(args.course, args.kit)
        print(f"student kit, for laptops offline: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
