"""Measure every chapter's reading and running time for the syllabus
(transformer_lite/classroom/timings.json).

* reading: the chapter's source, at 200 words of prose and 20 lines of
  code a minute (markdown cells are prose; cells the book removes and
  the planted answers are not counted);
* running: the seconds nbval took for the chapter, summed over its
  cells, from the JUnit report ``make nbval`` writes
  (``_build/nbval-junit.xml``), where each chapter ran whole on one CPU
  core, two chapters side by side.

Run after ``make nbval``: ``.venv/bin/python tools/chapter_times.py``
(``make chapter-times``). Chapters missing from the report keep their
last measured running time.
"""

import argparse
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMINGS = ROOT / "transformer_lite" / "classroom" / "timings.json"
REPORT = ROOT / "_build" / "nbval-junit.xml"
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 200, 20
HIDDEN = {"remove-cell", "planted"}


def reading_minutes(path: Path) -> int:
    """Minutes to read chapter ``path``, prose and code, rounded up."""
    words = code = 0
    for cell in jupytext.read(path).cells:
        if HIDDEN & set(cell.metadata.get("tags", [])):
            continue
        if cell.cell_type == "markdown":
            words += len(re.findall(r"\S+", cell.source))
        elif cell.cell_type == "code":
            code += sum(1 for line in cell.source.splitlines() if line.strip())
    return math.ceil(words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE)


def running_seconds(report: Path) -> dict[str, int]:
    """{"NN": seconds} of every chapter in the JUnit report."""
    seconds = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        where = case.get("file") or case.get("classname") or ""
        match = re.search(r"(\d\d)_\w+", where)
        if match:
            seconds[match.group(1)] += float(case.get("time", 0))
    return {key: round(value) for key, value in seconds.items()}


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
        seconds = ran.get(key, old.get(key, {}).get("running_seconds"))
        if seconds is None:
            print(f"no running time for chapter {key}: run make nbval")
            return 1
        timings[key] = {"reading_minutes": reading_minutes(path),
                        "running_seconds": seconds}  # fmt: skip
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")
    for key, entry in timings.items():
        print(f"chapter {key}: {entry['reading_minutes']} min to read, "
              f"{entry['running_seconds']} s to run")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
