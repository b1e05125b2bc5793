"""Run chapters under nbval with other book seeds; print a table.

``make seed-sweep`` runs every chapter that trains or samples with
``BOOK_SEED=1`` and ``BOOK_SEED=2`` (each chapter derives all of its
seeds from that one value). A claim that holds only for the seed the
book is built with fails here. Usage::

    python tools/seed_sweep.py --seeds '1 2' notebooks/06_training.ipynb ...

Prints a markdown table, chapter x seed -> passed / failed cells, then
the first line of each failure, and exits non-zero if any cell failed.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SHOWN = 5  # failures listed per run: the first is usually the cause

# Colour codes in tracebacks; junitxml writes the escape as "#x1B".
ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")
FAILING = re.compile(r"---->\s*(\d+)\s*(.*)")  # IPython's failing line

# The flags of `make nbval`, less the book's execution cache.
NBVAL = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "--nbval",
    "--nbval-current-env",
    "--nbval-sanitize-with",
    "notebooks/sanitize.cfg",
]


def run(notebook: Path, seed: int) -> dict:
    """One chapter under nbval with BOOK_SEED=seed: counts and failures."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "BOOK_SEED": str(seed)}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *NBVAL, f"--junitxml={report}", str(notebook)],
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        if not report.exists():  # pytest itself failed
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            return {
                "passed": 0,
                "failed": 1,
                "seconds": seconds,
                "failures": ["pytest: " + " | ".join(tail)],
            }
        cases = ET.parse(report).getroot().iter("testcase")
        passed, failures = 0, []
        for case in cases:
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is None:
                passed += case.find("skipped") is None
                continue
            text = ANSI.sub("", bad.text or bad.get("message") or "")
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            errors = [ln for ln in lines if "Error" in ln] or lines or [""]
            failing = [FAILING.match(ln) for ln in lines]
            failing = [m for m in failing if m]
            where = ""
            if failing:
                number, code = failing[-1].groups()
                where = f" (cell line {number}: {code})"
            failures.append(f"{case.get('name')}: {errors[-1]}{where}")
    return {
        "passed": passed,
        "failed": len(failures),
        "seconds": seconds,
        "failures": failures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument(
        "--seeds", default="1 2", help="book seeds, e.g. '1 2' (the default)"
    )
    args = parser.parse_args()
    args.seeds = [int(seed) for seed in args.seeds.replace(",", " ").split()]
    results = {}
    for notebook in args.notebooks:
        for seed in args.seeds:
            print(f"{notebook.stem}, BOOK_SEED={seed} ...", flush=True)
            results[notebook.stem, seed] = result = run(notebook, seed)
            print(
                f"  {result['passed']} passed, {result['failed']} failed"
                f" in {result['seconds']:.0f} s",
                flush=True,
            )
    print()
    print(
        "| chapter | "
        + " | ".join(f"BOOK_SEED={s}" for s in args.seeds)
        + " |"
    )
    print("|---" * (len(args.seeds) + 1) + "|")
    for notebook in args.notebooks:
        cells = []
        for seed in args.seeds:
            r = results[notebook.stem, seed]
            cells.append(f"{r['passed']} passed / {r['failed']} failed")
        print(f"| {notebook.stem} | " + " | ".join(cells) + " |")
    failed = {key: r for key, r in results.items() if r["failed"]}
    for (stem, seed), r in failed.items():
        print(f"\n{stem}, BOOK_SEED={seed}:")
        for failure in r["failures"][:SHOWN]:
            print(f"  {failure[:300]}")
        if len(r["failures"]) > SHOWN:
            print(f"  ... and {len(r['failures']) - SHOWN} more")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
