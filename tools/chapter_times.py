"""Measure every chapter's reading and running time for the syllabus
(transformer_lite/classroom/timings.json).

* reading: the chapter's source, at 200 words of prose and 20 lines of
  code a minute (markdown cells are prose; cells the book removes and
  the planted answers and the written questions' model answers are
  not counted);
* running: the seconds nbval took for the chapter, summed over its
  cells, from the JUnit report ``make nbval`` writes
  (``_build/nbval-junit.xml``), where each chapter ran whole on one CPU
  core, two chapters side by side.

Run after ``make nbval``: ``.venv/bin/python tools/chapter_times.py``
(``make chapter-times``). Chapters missing from the report keep their
last measured running time. The nbgrader tests' times are kept too:
each chapter's grading as its ``grading_seconds``, the tests of every
assignment at once as ``assignments``. ``make nbval`` hands the chapters
and the gradings to its workers longest first by these times
(``tools/whole_chapters.py``), so that the workers finish close
together."""

import argparse
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMINGS = ROOT / "transformer_lite" / "classroom" / "timings.json"
REPORT = ROOT / "_build" / "nbval-junit.xml"
# A chapter's budget under make nbval: one thread, beside another chapter
# (alone at two threads it is 3 minutes, measured by hand).
BUDGET_SECONDS = 240
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 200, 20
HIDDEN = {"remove-cell", "planted", "written"}  # written: the model answers


def reading_minutes(path: Path) -> int:
    """Minutes to read chapter ``path``, prose and code, rounded up."""
    import jupytext  # the venv's; the rest of this file needs nothing

    words = code = 0
    for cell in jupytext.read(path).cells:
        if HIDDEN & set(cell.metadata.get("tags", [])):
            continue
        if cell.cell_type == "markdown":
            words += len(re.findall(r"\S+", cell.source))
        elif cell.cell_type == "code":
            code += sum(1 for line in cell.source.splitlines() if line.strip())
    return math.ceil(words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE)


def timing_key(where: str, name: str = "") -> str | None:
    """The key of a JUnit test case, from its file (or class) and name:
    "NN" for a cell of chapter NN, "NN grading" for a test of chapter
    NN's nbgrader grading, "assignments" for the other nbgrader tests."""
    if "test_assignments" in where:
        graded = re.search(r"\[(?:\w+-)?(\d\d)_\w+", name)
        return f"{graded.group(1)} grading" if graded else "assignments"
    match = re.search(r"(?:^|[./])(\d\d)_\w+", where)
    return match.group(1) if match else None


def running_seconds(report: Path) -> dict[str, int]:
    """{key: seconds} of every chapter in the JUnit report, of every
    chapter's grading and of the other nbgrader tests (keys as in
    :func:`timing_key`)."""
    seconds = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        where = case.get("file") or case.get("classname") or ""
        key = timing_key(where, case.get("name", ""))
        if key:
            seconds[key] += float(case.get("time", 0))
    return {key: round(value) for key, value in seconds.items()}


def expected_seconds(key: str, timings: dict | None = None) -> int:
    """The last measured seconds of ``key`` (as in :func:`timing_key`);
    0 for anything never measured."""
    if timings is None:
        timings = json.loads(TIMINGS.read_text()) if TIMINGS.is_file() else {}
    chapter, _, grading = key.partition(" ")
    field = "grading_seconds" if grading == "grading" else "running_seconds"
    return timings.get(chapter, {}).get(field, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    old = json.loads(TIMINGS.read_text()) if TIMINGS.is_file() else {}
    ran = running_seconds(args.report) if args.report.is_file() else {}
    timings = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")):
        key = path.name[:2]
        if key == "00":
            continue
        last = old.get(key, {})
        seconds = ran.get(key, last.get("running_seconds"))
        if seconds is None:
            print(f"no running time for chapter {key}: run make nbval")
            return 1
        timings[key] = {"reading_minutes": reading_minutes(path),
                        "running_seconds": seconds}  # fmt: skip
        grading = ran.get(f"{key} grading", last.get("grading_seconds"))
        if grading is not None:
            timings[key]["grading_seconds"] = grading
    if "assignments" in ran or "assignments" in old:
        timings["assignments"] = {
            "running_seconds": ran.get(
                "assignments",
                old.get("assignments", {}).get("running_seconds"),
            )
        }
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")
    over = []
    for key, entry in timings.items():
        graded = entry.get("grading_seconds")
        print(f"{key}: {entry.get('reading_minutes', '-')} min to read, "
              f"{entry['running_seconds']} s to run"
              + (f", {graded} s to grade" if graded is not None else ""))
        if key != "assignments" and entry["running_seconds"] > BUDGET_SECONDS:
            over.append(key)
    if over:
        print(f"over the budget of {BUDGET_SECONDS} s a chapter: {over}")
        return 1
    print(f"every chapter within its budget of {BUDGET_SECONDS} s "
          "(one thread, beside another chapter)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
