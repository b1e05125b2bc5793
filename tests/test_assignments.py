"""The classroom edition: every chapter's graded exercises, as real
nbgrader grades them. The instructor version (the reference solutions)
scores full marks; the student edition, handed in untouched, scores zero
without breaking the grader; and a planted wrong answer per chapter
loses its exercise's points (and those of any exercise built on it),
with the failure message its author wrote for that mistake. Every check
runs inside its exercise's ``exercise(...)`` block, and the cheats earn
nothing: an answer that hands the work to the package's own twin, and
one that returns a trivially related tensor, score zero on their
exercise."""

import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import assignments  # noqa: E402 - tools/ is not a package

pytest.importorskip("nbgrader")
# Beside the chapters, in make nbval, whose workers take each chapter's
# grading (the tests parametrised by chapter) as a piece of work of its
# own, and the other tests together (tools/whole_chapters.py).
pytestmark = pytest.mark.classroom
# CHAPTERS="01 03" grades those chapters only, while writing exercises
CHAPTERS = assignments.chapters(os.environ.get("CHAPTERS", "").split())
VERSIONS = ("instructor", "student", "planted", *assignments.CHEATS)


def test_every_chapter_has_five_graded_exercises_and_a_planted_error():
    for path in CHAPTERS:
        job = assignments.assignment(path)
        assert job.exercises >= 5, f"{path.name}: {job.exercises} exercises"
        assert job.planted is not None, f"{path.name}: no planted answer"


def test_every_chapter_asks_a_prediction_and_a_written_question():
    for path in CHAPTERS:
        job = assignments.assignment(path)
        assert job.predictions >= 1, f"{path.name}: no prediction"
        assert job.written >= 1, f"{path.name}: no written question"


def test_every_exercise_tests_an_objective_and_every_one_is_tested():
    """syllabus.json maps each exercise to the chapter's objectives it
    tests; no exercise is left out and no objective goes untested."""
    from transformer_lite.classroom import syllabus

    for path in CHAPTERS:
        job = assignments.assignment(path)
        entry = syllabus()[int(path.name[:2])]
        assert set(entry.exercises) == set(range(1, job.exercises + 1)), (
            f"{path.name}: syllabus.json maps exercises "
            f"{sorted(entry.exercises)}; the chapter has {job.exercises}"
        )
        for goal in range(1, len(entry.objectives) + 1):
            assert entry.tested_by(goal), (
                f"{path.name}: no exercise tests objective {goal}: "
                f"{entry.objectives[goal - 1]!r}"
            )


def test_the_student_edition_speaks_to_students():
    """No word of the book's own folded solutions or of the classroom
    edition as something else: the student holds it."""
    for path in CHAPTERS:
        job = assignments.assignment(path)
        text = " ".join(c.source for c in job.cells
                        if c.cell_type == "markdown").lower()  # fmt: skip
        for words in ("classroom edition", "teaching page", "folded"):
            assert words not in text, f"{path.name} says {words!r}"
        assert "Shift+Enter" in job.cells[0].source


def test_the_builder_explains_a_malformed_section(tmp_path):
    chapter = tmp_path / "99_bad.py"
    head = "# %% [markdown]\n# # 99. Bad\n\n# %% [markdown]\n"
    section = head + "# ## Graded exercises\n\n"
    chapter.write_text(section + '# %% tags=["solution"]\ndef f():\n  1\n')
    with pytest.raises(ValueError, match="BEGIN SOLUTION"):
        assignments.assignment(chapter)
    chapter.write_text(section + '# %% tags=["check"]\nassert True\n')
    with pytest.raises(ValueError, match="check before any solution"):
        assignments.assignment(chapter)
    chapter.write_text(head + "# ## Exercises\n")
    with pytest.raises(ValueError, match="no '## Graded exercises'"):
        assignments.assignment(chapter)


def test_every_check_runs_inside_its_exercise():
    for path in CHAPTERS:
        job = assignments.assignment(path)
        for check in job.checks:
            number = f"{int(path.name[:2])}.{check.exercise}"
            assert check.number == number, (
                f"{path.name}: a check of exercise {number} runs inside "
                f"exercise({check.number!r}) instead"
            )


def test_every_exercise_with_a_twin_is_cheated_both_ways():
    """An exercise the package (or torch) answers has a cheat that
    delegates to that twin and one that returns something trivial; a
    delegating cheat belongs to an exercise that refuses its twin."""
    for path in CHAPTERS:
        job = assignments.assignment(path)
        kinds = {}
        for cheat in job.cheats:
            kinds.setdefault(cheat.exercise, set()).add(cheat.kind)
        for k in range(1, job.exercises + 1):
            if job.twins(k):
                assert kinds.get(k, set()) >= set(assignments.CHEATS), (
                    f"{path.name}: exercise {k} has twins {job.twins(k)} "
                    f"but cheats {sorted(kinds.get(k, ()))}"
                )
        for cheat in job.cheats:
            if cheat.kind == "delegate":
                assert job.twins(cheat.exercise), (
                    f"{path.name}: exercise {cheat.exercise} is cheated by "
                    "delegation, but its checks refuse no twin"
                )


def replaced(job, source: Path, answers: dict) -> nbformat.NotebookNode:
    """The instructor version with the solutions of some exercises
    replaced: ``answers`` maps an exercise (1-based) to its new code."""
    notebook = nbformat.read(source, as_version=4)
    for exercise, code in answers.items():
        wanted = f"{job.name}-ex{exercise}"
        cells = [c for c in notebook.cells
                 if c.metadata["nbgrader"]["grade_id"] == wanted]  # fmt: skip
        assert len(cells) == 1
        cells[0].source = code
    return notebook


def version_of(job, source: Path, version: str) -> nbformat.NotebookNode:
    if version == "planted":
        return replaced(job, source, {job.planted.exercise: job.planted.code})
    cheats = {c.exercise: c.code for c in job.cheats if c.kind == version}
    return replaced(job, source, cheats)


def grade(path: Path, course: Path) -> dict:
    """Build chapter ``path``'s assignment in the course folder
    ``course``, hand in every version of it and autograde them all:
    {version: (score, max, notebook, job)}. The scores are also written
    to ``_build/classroom-grades/`` for review (``tools/assignments.py
    --table``)."""
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI

    (job,) = assignments.build([path], course)
    api = NbGraderAPI(config=assignments.course_config(course))
    source = course / "source" / job.name / f"{job.name}.ipynb"
    release = course / "release" / job.name / f"{job.name}.ipynb"
    cheats = {c.kind for c in job.cheats}
    handed_in = []
    for version in VERSIONS:
        out = course / "submitted" / version / job.name
        target = out / f"{job.name}.ipynb"
        if version in ("instructor", "student"):  # handed in as it is
            out.mkdir(parents=True)
            shutil.copy(source if version == "instructor" else release, target)
        elif version == "planted" or version in cheats:
            out.mkdir(parents=True)
            nbformat.write(version_of(job, source, version), target)
        else:
            continue  # a chapter without cheats of this kind
        result = api.autograde(job.name, version, force=True, create=True)
        assert result["success"], result["log"]
        handed_in.append(version)
    results = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for version in handed_in:
            sub = gradebook.find_submission(job.name, version)
            path = course / "autograded" / version / job.name
            notebook = nbformat.read(path / f"{job.name}.ipynb", 4)
            results[version] = (sub.score, sub.max_score, notebook, job)
    assignments.GRADES.mkdir(parents=True, exist_ok=True)
    scores = {version: r[:2] for version, r in results.items()}
    report = assignments.GRADES / f"{job.name}.json"
    report.write_text(json.dumps(scores, indent=1) + "\n")
    return results


@pytest.fixture(scope="module")
def gradings() -> dict:
    """Each chapter's grading, done once per test process."""
    return {}


@pytest.fixture
def graded(gradings, chapter, tmp_path_factory):
    """Chapter ``chapter``'s every version, graded by nbgrader (once):
    {version: (score, max, notebook, job)}. A grading that failed fails
    each of the chapter's tests without grading again."""
    if chapter not in gradings:
        course = tmp_path_factory.mktemp(f"course-{chapter[:2]}")
        try:
            gradings[chapter] = grade(ROOT / "notebooks" / chapter, course)
        except Exception as error:  # noqa: BLE001 - raised again below
            gradings[chapter] = error
    if isinstance(gradings[chapter], Exception):
        raise gradings[chapter]
    return gradings[chapter]


def failures(notebook) -> dict[str, str]:
    """{grade_id: error text} of every graded cell that raised."""
    failed = {}
    for cell in notebook.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not nbgrader.get("grade"):
            continue
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                text = f"{output.ename}: {output.evalue}"
                failed[nbgrader["grade_id"]] = text
    return failed


@pytest.mark.parametrize("chapter", [p.name for p in CHAPTERS])
def test_nbgrader_scores_the_three_versions(graded, chapter):
    """The written answers are marked by hand: nbgrader counts their
    points in the maximum and none of them before a teacher marks."""
    name = "ch" + chapter[:2]
    score, top, notebook, job = graded["instructor"]
    assert top == job.points + job.manual_points and job.points > 0
    assert score == job.points, failures(notebook)
    score, _, notebook, _ = graded["student"]
    assert score == 0
    assert all("NotImplementedError" in text or "NameError" in text
               for text in failures(notebook).values())  # fmt: skip
    score, _, notebook, _ = graded["planted"]
    failed = failures(notebook)
    planted = f"{name}-ex{job.planted.exercise}-check"
    mine = [text for gid, text in failed.items() if gid.startswith(planted)]
    assert any(job.planted.message in text for text in mine), (
        f"no check of exercise {job.planted.exercise} says "
        f"{job.planted.message!r}: {failed}"
    )  # a later exercise that builds on this one may fail too
    graded = [cell.metadata.get("nbgrader", {}) for cell in notebook.cells]
    lost = sum(g["points"] for g in graded if g.get("grade_id") in failed)
    assert score == job.points - lost < job.points


@pytest.mark.parametrize("chapter", [p.name for p in CHAPTERS])
def test_a_written_answer_is_the_students_to_write(graded, chapter):
    """The instructor version keeps the model answer and its rubric; the
    student edition leaves the answer cell to the student."""
    job = graded["instructor"][3]
    if not job.written:
        pytest.skip(f"{chapter} asks no written question")
    for version, present in (("instructor", True), ("student", False)):
        notebook = graded[version][2]
        answers = [c.source for c in notebook.cells
                   if c.metadata.get("nbgrader", {}).get("grade_id", "")
                   .endswith("-written")]  # fmt: skip
        assert len(answers) == job.written
        for answer in answers:
            assert ("Rubric" in answer) is present, answer[:80]
            assert ("YOUR ANSWER HERE" in answer) is not present


@pytest.mark.parametrize("chapter", [p.name for p in CHAPTERS])
@pytest.mark.parametrize("kind", assignments.CHEATS)
def test_a_cheat_earns_nothing(graded, chapter, kind):
    """Every check of a cheated exercise fails; a delegating answer is
    refused as one ("asks you to write this yourself"), not by luck."""
    name = "ch" + chapter[:2]
    cheated = {c.exercise for c in graded["instructor"][3].cheats
               if c.kind == kind}  # fmt: skip
    if not cheated:
        pytest.skip(f"{chapter} has no {kind} cheat")
    _, _, notebook, job = graded[kind]
    failed = failures(notebook)
    for exercise in sorted(cheated):
        prefix = f"{name}-ex{exercise}-check"
        checks = [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells
                  if c.metadata.get("nbgrader", {}).get("grade_id", "")
                  .startswith(prefix)]  # fmt: skip
        assert checks, f"{name}: exercise {exercise} has no check"
        for gid in checks:
            assert gid in failed, f"{kind} cheat of {gid} earned its points"
            if kind == "delegate":
                assert "write this yourself" in failed[gid], failed[gid]


def test_the_student_kit_holds_what_a_laptop_needs_and_no_solution(tmp_path):
    """The kit (make student-kit) for a class without a network: the
    student edition, the package as a wheel that installs and imports on
    its own, the pins without the developers' tools; not one reference
    solution, hidden test or rubric."""
    import subprocess
    import zipfile

    course = tmp_path / "course"
    assignments.build(CHAPTERS, course)
    kit = assignments.kit(course, tmp_path / "kit")
    for path in CHAPTERS:
        name = "ch" + path.name[:2]
        assert (kit / "assignments" / name / f"{name}.ipynb").is_file()
    for notebook in (kit / "assignments").rglob("*.ipynb"):
        text = notebook.read_text()
        for secret in ("BEGIN SOLUTION", "HIDDEN TESTS", "Rubric"):
            assert secret not in text, f"{notebook.name} holds {secret!r}"
    pins = (kit / "requirements.txt").read_text()
    assert "torch==" in pins and "nbgrader==" in pins
    assert "pytest" not in pins and "jupyter-book" not in pins
    (wheel,) = (kit / "wheels").glob("transformer_lite-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "transformer_lite/classroom/syllabus.json" in names
    assert not [n for n in names if n.endswith((".ipynb", ".py"))
                and not n.startswith("transformer_lite/")]  # fmt: skip
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True)  # fmt: skip
    where = subprocess.run(
        [sys.executable, "-c", "import transformer_lite.classroom as c; "
         "print(c.__file__); print(len(c.syllabus()))"],
        env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert where[0].startswith(str(target)) and int(where[1]) >= 12


def hub_commands() -> list[str]:
    """The teacher's nbgrader commands, as the teaching page's JupyterHub
    section writes them."""
    page = (ROOT / "notebooks" / "teaching.py").read_text()
    section = page.split("# ### On a JupyterHub", 1)[1].split("# ### ", 1)[0]
    block = section.split("# ```bash\n", 1)[1].split("# ```", 1)[0]
    return [line[2:].split("#")[0].strip() for line in block.splitlines()
            if line.startswith("# nbgrader ")]  # fmt: skip


def test_the_jupyterhub_recipe_runs_as_written(tmp_path):
    """The teaching page's commands, in its order, on a course folder
    and an exchange of our own (what a hub's nbgrader is configured
    with): released, fetched and handed in by a student who did the
    work, collected, autograded to full marks, and fed back in a page
    that says so without the checkers' frames."""
    import subprocess

    commands = hub_commands()
    assert [c.split()[1] for c in commands] == [
        "release_assignment", "collect", "autograde", "generate_feedback"
    ]  # fmt: skip
    path = CHAPTERS[0]
    name = "ch" + path.name[:2]
    course, exchange, home = (tmp_path / d for d in ("course", "x", "home"))
    (job,) = assignments.build([path], course)
    exchange.mkdir()
    home.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}"
           f"{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    where = [f"--Exchange.root={exchange}"]

    def nbgrader(command: str, cwd: Path, *more: str) -> None:
        args = command.replace("ch01", name).split()
        done = subprocess.run([*args, *where, *more], cwd=cwd, env=env,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    release, collect, autograde, feedback = commands
    nbgrader(release, course)
    student = ["--course", "transformer-lite"]
    nbgrader(f"nbgrader fetch_assignment {name}", home, *student)
    handed_in = home / name / f"{name}.ipynb"
    shutil.copy(course / "source" / name / f"{name}.ipynb", handed_in)
    nbgrader(f"nbgrader submit {name}", home, *student)
    for command in (collect, autograde, feedback):
        nbgrader(command, course)
    (page,) = (course / "feedback").glob(f"*/{name}/{name}.html")
    html = page.read_text()
    assert f"Score: {float(job.points)} / " in html
    assert "every check passed" in html
    assert "grading.py" not in html and "exercises.py" not in html
