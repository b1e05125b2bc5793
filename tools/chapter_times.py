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
last measured running time. The nbgrader test's time is kept too, as
``assignments``: ``--longest-first FILE...`` prints the chapters and that
test longest first, the order in which ``make nbval`` hands them to its
workers, so that the two finish close together.
"""

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


def timing_key(where: str) -> str | None:
    """ "NN" for a chapter, "assignments" for the nbgrader test."""
    if "test_assignments" in where:
        return "assignments"
    match = re.search(r"(?:^|[./])(\d\d)_\w+", where)
    return match.group(1) if match else None


def running_seconds(report: Path) -> dict[str, int]:
    """{"NN": seconds} of every chapter in the JUnit report, and
    {"assignments": seconds} of the nbgrader test."""
    seconds = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        key = timing_key(case.get("file") or case.get("classname") or "")
        if key:
            seconds[key] += float(case.get("time", 0))
    return {key: round(value) for key, value in seconds.items()}


def longest_first(paths: list[str]) -> list[str]:
    """``paths`` by their last measured running time, longest first
    (unmeasured ones last, in the given order)."""
    timings = json.loads(TIMINGS.read_text()) if TIMINGS.is_file() else {}

    def seconds(path: str) -> int:
        entry = timings.get(timing_key(Path(path).name) or "", {})
        return entry.get("running_seconds", 0)

    return sorted(paths, key=seconds, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--longest-first", nargs="+", metavar="FILE")
    args = parser.parse_args(argv)
    if args.longest_first:
        print("\n".join(longest_first(args.longest_first)))
        return 0
    old = json.loads(TIMINGS.read_text()) if TIMINGS.is_file() else {}
    ran = running_seconds(args.report) if args.report.is_file() else {}
    timings = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")):
        key = path.name[:2]
        if key == "00":
            continue
        seconds = ran.get(key, old.get(key, {}).get("running_seconds"))
        if seconds is None:
            print(f"no running time for chapter {key}: run make nbval")
            return 1
        timings[key] = {"reading_minutes": reading_minutes(path),
                        "running_seconds": seconds}  # fmt: skip
    if "assignments" in ran or "assignments" in old:
        timings["assignments"] = {
            "running_seconds": ran.get(
                "assignments",
                old.get("assignments", {}).get("running_seconds"),
            )
        }
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")
    for key, entry in timings.items():
        print(f"{key}: {entry.get('reading_minutes', '-')} min to read, "
              f"{entry['running_seconds']} s to run")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
