"""Time the phases of ``make test`` and print where the time went.

``make test`` runs each phase through this script::

    python tools/test_phases.py run unit -- make unit

which runs the command, appends the phase's name, seconds and exit
status to ``_build/test-phases.tsv`` and passes the status on. A failing
phase prints the summary before ``make`` stops. At the end::

    python tools/test_phases.py report

prints the phases with their seconds, then the ten slowest unit tests
(from ``_build/unit-junit.xml``) and the ten slowest chapters (from
``_build/nbval-junit.xml``, each chapter's cells summed, as
``tools/chapter_times.py`` sums them). ``start`` clears the record
and the unit tests' report.

Only the standard library is used: the first phase creates the virtual
environment, so this script runs on the system's Python.
"""

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
PHASES = BUILD / "test-phases.tsv"
UNIT_REPORT = BUILD / "unit-junit.xml"
NBVAL_REPORT = BUILD / "nbval-junit.xml"
SLOWEST = 10


def run(name: str, command: list[str]) -> int:
    """Run ``command`` as phase ``name``; record its seconds and status."""
    if not command:
        print(f"phase {name}: no command given", file=sys.stderr)
        return 2
    start = time.monotonic()
    status = subprocess.call(command)
    seconds = time.monotonic() - start
    BUILD.mkdir(exist_ok=True)
    with PHASES.open("a") as record:
        record.write(f"{name}\t{seconds:.1f}\t{status}\n")
    if status != 0:
        print(f"\nphase {name} failed (exit status {status})")
        report()
    return status


def read_phases() -> list[tuple[str, float, int]]:
    """The phases recorded so far: (name, seconds, exit status)."""
    if not PHASES.is_file():
        return []
    rows = []
    for line in PHASES.read_text().splitlines():
        name, seconds, status = line.split("\t")
        rows.append((name, float(seconds), int(status)))
    return rows


def slowest_tests(report: Path, n: int = SLOWEST) -> list[tuple[str, float]]:
    """The ``n`` slowest test cases of a JUnit report: (id, seconds)."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        where = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((where, float(case.get("time", 0))))
    return sorted(cases, key=lambda c: c[1], reverse=True)[:n]


def slowest_chapters(report: Path, n: int = SLOWEST) -> list[tuple[str, int]]:
    """The ``n`` slowest chapters (and the nbgrader test) of nbval's
    report, as ``tools/chapter_times.py`` counts them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from chapter_times import running_seconds  # needs the venv (jupytext)

    ran = running_seconds(report)
    return sorted(ran.items(), key=lambda c: c[1], reverse=True)[:n]


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |"
              for row in rows]  # fmt: skip
    return "\n".join(lines)


def report() -> int:
    phases = read_phases()
    if not phases:
        print("no phases recorded: run make test")
        return 1
    rows = [(name, f"{s:.0f}", "ok" if status == 0 else f"FAILED ({status})")
            for name, s, status in phases]  # fmt: skip
    total = sum(s for _, s, _ in phases)
    rows.append(("total", f"{total:.0f}", f"{total / 60:.1f} min"))
    print("\n## make test: the phases\n")
    print(table(("phase", "seconds", "status"), rows))
    if UNIT_REPORT.is_file():
        print(f"\n## The {SLOWEST} slowest unit tests\n")
        slow = [(where, f"{s:.1f}") for where, s in slowest_tests(UNIT_REPORT)]
        print(table(("test", "seconds"), slow))
    if NBVAL_REPORT.is_file():
        print(f"\n## The {SLOWEST} slowest chapters (one core each)\n")
        try:
            slow = slowest_chapters(NBVAL_REPORT)
        except ImportError as err:
            print(f"(not read: {err})")
        else:
            print(table(("chapter", "seconds"), slow))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("start", help="clear the record of phases")
    timed = commands.add_parser("run", help="run and time one phase")
    timed.add_argument("name")
    timed.add_argument("cmd", nargs=argparse.REMAINDER)
    commands.add_parser("report", help="print the phases and the slowest")
    args = parser.parse_args(argv)
    if args.command == "start":
        PHASES.unlink(missing_ok=True)
        UNIT_REPORT.unlink(missing_ok=True)
        return 0
    if args.command == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return run(args.name, cmd)
    return report()


if __name__ == "__main__":
    sys.exit(main())
