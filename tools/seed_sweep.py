"""Run chapters over seeds, CPU kernels and thread counts; measure claims.

A trained model depends on the seed, on the kernels PyTorch's CPU code
picks for the instruction set (ATen's dispatch, MKL, oneDNN) and on the
number of threads that split each sum: each is another rounding, and
training amplifies a rounding into another model. ``make seed-sweep``
runs every chapter that trains, samples or measures under a grid of
settings and records the values of every assert in it
(``tools/sweep_claims.py``), so that each floor can be set from the worst
run with a stated margin. Usage::

    python tools/seed_sweep.py --seeds '0 1 2' --kernels 'native avx2 \
        baseline' --threads '1 2' notebooks/06_training.ipynb ...

The grid is every seed under every kernel setting at one thread, plus
every seed at each other thread count on the native kernels (3 x 3 + 3
x 1 = 12 runs a chapter by default). A native run is named by what
ATen picked on this CPU (``s0-avx512-t1`` on an AVX-512 machine,
``s0-avx2-t1`` on an AVX2 one), so tables from two CPUs merge
(``--merge``) with every run under its own name. Jobs run
``--workers`` at a time, a two-thread job taking two workers' cores.

Writes one JSON file per run under ``--out`` (default _build/sweep) and,
with ``--record DIR``, a table per chapter to DIR/NN.json; prints a
chapter x setting table, then per assert the floor, the worst value, the
spread and the margin, and exits non-zero if any run failed a claim or
raised.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent

# Each setting is another machine: the environment variables that make
# this CPU pick the kernels another CPU would.
KERNELS = {
    "native": {},  # what this CPU picks by itself
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "baseline": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
    "avx512": {  # only on a CPU that has AVX-512
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    },
}
SHOWN = 5  # failures listed per run: the first is usually the cause


def setting_name(seed: int, kernels: str, threads: int) -> str:
    return f"s{seed}-{kernels}-t{threads}"


def shown(kernels: str) -> str:
    """A setting's name in the tables: the native one is named by what
    ATen picked on this CPU (``avx2`` on an AVX2 machine, ``avx512`` on an
    AVX-512 one), so that tables measured on different CPUs merge without
    two different runs sharing the name ``native``."""
    return native_capability() if kernels == "native" else kernels


def execute(notebook: Path, out: Path) -> int:
    """Run one chapter (in this process's environment), asserts recorded."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    setup = (
        f"import sys; sys.path.insert(0, {str(TOOLS)!r})\n"
        f"import sweep_claims; sweep_claims.install({str(out)!r})"
    )
    nb.cells.insert(0, nbformat.v4.new_code_cell(setup))
    nb.cells.append(nbformat.v4.new_code_cell("sweep_claims.finish()"))
    client = NotebookClient(
        nb,
        timeout=1800,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    errors = []
    for index, cell in enumerate(nb.cells[1:-1]):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(
                    {
                        "cell": index,
                        "error": f"{output['ename']}: {output['evalue']}",
                        "source": cell.source.splitlines()[:1],
                    }
                )
    run = json.loads(out.read_text()) if out.exists() else {"claims": []}
    run.update(seconds=seconds, errors=errors)
    out.write_text(json.dumps(run, indent=1))
    return 0


@functools.cache
def native_capability() -> str:
    """The name in KERNELS of what ATen picks here by itself."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def plan(seeds, kernels, threads) -> list[tuple[int, str, int]]:
    """Every seed x kernel setting at one thread; other thread counts on
    the native kernels only. Without 1 among the threads, only the
    other thread counts run (``--threads 2`` adds them to a sweep)."""
    grid = [(s, k, 1) for s in seeds for k in kernels if 1 in threads]
    grid += [(s, "native", t) for s in seeds for t in threads if t != 1]
    return grid


def job_env(seed: int, kernels: str, threads: int, out: Path) -> dict:
    """The environment of one job: the seed, the kernel setting's
    variables, the thread count, and an inductor cache of the setting's
    own. A cache shared between settings is not safe: on an AVX-512 CPU,
    chapter 8's model compiled under the native kernels and then loaded
    from the cache under ``avx2`` gave NaN logits, and compiled afresh
    under ``avx2`` it matched eager to 5e-7."""
    return {
        **os.environ,
        **KERNELS[kernels],
        "BOOK_SEED": str(seed),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TORCHINDUCTOR_CACHE_DIR": str(out / f"inductor-{kernels}"),
    }


def run_all(notebooks, grid, workers: int, out: Path) -> dict:
    """Run every (chapter, setting) job, ``workers`` cores at a time."""
    jobs = [(nb, setting) for setting in grid for nb in notebooks]
    # Two-thread jobs last, so that the one-thread ones pair up.
    jobs.sort(key=lambda job: job[1][2])
    running: list[tuple] = []
    results = {}
    free = workers
    while jobs or running:
        while jobs and min(jobs[0][1][2], workers) <= free:
            notebook, (seed, kernels, threads) = jobs.pop(0)
            name = setting_name(seed, shown(kernels), threads)
            path = out / notebook.stem / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            env = job_env(seed, kernels, threads, out)
            log = open(path.with_suffix(".log"), "w")  # noqa: SIM115
            process = subprocess.Popen(
                [sys.executable, __file__, "--one", str(notebook)]
                + ["--one-out", str(path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            cores = min(threads, workers)
            free -= cores
            running.append((process, log, notebook, name, path, cores))
            print(f"started {notebook.stem} {name}", flush=True)
        time.sleep(1)
        for job in list(running):
            process, log, notebook, name, path, cores = job
            if process.poll() is None:
                continue
            running.remove(job)
            log.close()
            free += cores
            results[notebook.stem, name] = result = load(path)
            print(
                f"finished {notebook.stem} {name}: {summary(result)}",
                flush=True,
            )
    return results


def load(path: Path) -> dict:
    if not path.exists():
        log = path.with_suffix(".log")
        tail = (
            log.read_text().strip().splitlines()[-3:] if log.exists() else []
        )
        return {
            "claims": [],
            "errors": [{"cell": -1, "error": " | ".join(tail)}],
            "seconds": 0.0,
            "info": {},
        }
    return json.loads(path.read_text())


def failures(result: dict) -> list[str]:
    bad = [f"cell {e['cell']}: {e['error'][:200]}" for e in result["errors"]]
    bad += [
        f"assert {c['text'][:150]}  {values_text(c)}"
        for c in result["claims"]
        if not c["passed"]
    ]
    return bad


def values_text(claim: dict) -> str:
    values = [f"{v:.6g}" if v is not None else "?" for v in claim["values"]]
    return "(" + ", ".join(values) + ")" if values else ""


def summary(result: dict) -> str:
    claims = result["claims"]
    held = sum(c["passed"] for c in claims)
    return (
        f"{held}/{len(claims)} claims held, {len(result['errors'])} errors,"
        f" {result.get('seconds', 0):.0f} s"
        f" ({result.get('info', {}).get('cpu_capability', '?')})"
    )


def margin_of(claim: dict) -> float | None:
    """How far a comparison is from failing (negative: it failed)."""
    values, ops = claim["values"], claim["ops"]
    if not ops or any(v is None for v in values):
        return None
    margins = []
    for left, op, right in zip(values, ops, values[1:], strict=False):
        if op in ("<", "<="):
            margins.append(right - left)
        elif op in (">", ">="):
            margins.append(left - right)
        else:
            return None
    return min(margins)


def claim_table(stem: str, results: dict) -> list[dict]:
    """Per assert of one chapter: the floor, worst value, spread, margin."""
    runs = {
        name: r
        for (s, name), r in results.items()
        if s == stem and not r.get("missing")
    }
    rows: dict[tuple, dict] = {}
    for name, result in runs.items():
        for claim in result["claims"]:
            key = (claim["cell"], claim["text"], claim["n"])
            row = rows.setdefault(
                key,
                {
                    "cell": claim["cell"],
                    "assert": claim["text"],
                    "n": claim["n"],
                    "ops": claim["ops"],
                    "values": {},
                    "held": {},
                },
            )
            row["values"][name] = claim["values"]
            row["held"][name] = claim["passed"]
    table = []
    for row in rows.values():
        margins = [
            margin_of({"values": v, "ops": row["ops"]})
            for v in row["values"].values()
        ]
        numeric = [m for m in margins if m is not None]
        row["runs"] = len(row["held"])
        row["failed_in"] = sorted(n for n, ok in row["held"].items() if not ok)
        if numeric and len(numeric) == len(margins):
            columns = list(zip(*row["values"].values(), strict=False))
            varying = [c for c in columns if max(c) > min(c)]
            spread = max((max(c) - min(c) for c in varying), default=0.0)
            worst = min(margins)
            row["worst_margin"] = worst
            row["spread"] = spread
            row["ranges"] = [[min(c), max(c)] for c in columns]
            # A floor must sit a third of the spread below the worst run;
            # with less room than twice the spread, seeds 3-4 are owed too.
            row["tight"] = spread > 0 and worst < spread / 3
            row["needs_more_seeds"] = spread > 0 and worst < 2 * spread
        table.append(row)
    table.sort(key=lambda r: (r["cell"], r["n"]))
    return table


def collapse(table: list[dict]) -> list[dict]:
    """One row per assert statement: the passes of a loop together (the
    worst margin over them, each operand's range over all of them)."""
    rows: dict[tuple, dict] = {}
    for row in table:
        key = (row["cell"], row["assert"])
        out = rows.setdefault(
            key,
            {
                "cell": row["cell"],
                "assert": row["assert"],
                "evaluations": 0,
                "runs": row["runs"],
                "failed_in": set(),
            },
        )
        out["evaluations"] += 1
        out["failed_in"] |= set(row["failed_in"])
        if "worst_margin" in row:
            out["worst_margin"] = min(
                out.get("worst_margin", float("inf")), row["worst_margin"]
            )
            out["spread"] = max(out.get("spread", 0.0), row["spread"])
            if out["evaluations"] == 1:
                out["ranges"] = [list(r) for r in row["ranges"]]
            elif len(out.get("ranges", [])) == len(row["ranges"]):
                out["ranges"] = [
                    [min(a[0], b[0]), max(a[1], b[1])]
                    for a, b in zip(out["ranges"], row["ranges"], strict=True)
                ]
    for out in rows.values():
        out["failed_in"] = sorted(out["failed_in"])
    return list(rows.values())


def report(
    notebooks, grid, results: dict, record: Path | None, label=shown
) -> int:
    names = [setting_name(s, label(k), t) for s, k, t in grid]
    print("\n| chapter | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for nb in notebooks:
        cells = []
        for name in names:
            r = results[nb.stem, name]
            bad = len(failures(r))
            if r.get("missing"):
                cells.append("-")
            else:
                cells.append(f"{'ok' if not bad else f'{bad} failed'}")
        print(f"| {nb.stem} | " + " | ".join(cells) + " |")
    any_failed = False
    for (stem, name), r in sorted(results.items()):
        bad = failures(r)
        if bad:
            any_failed = True
            print(f"\n{stem}, {name}:")
            for line in bad[:SHOWN]:
                print(f"  {line}")
            if len(bad) > SHOWN:
                print(f"  ... and {len(bad) - SHOWN} more")
    for nb in notebooks:
        table = claim_table(nb.stem, results)
        measured = [r for r in table if r.get("spread", 0) > 0]
        print(f"\n{nb.stem}: claims whose values vary over the sweep")
        print("| cell | assert | ranges | worst margin | spread | flag |")
        print("|---|---|---|---|---|---|")
        for row in measured:
            ranges = ", ".join(
                f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"
                for lo, hi in row["ranges"]
            )
            flag = (
                "FAILED"
                if row["worst_margin"] < 0 or row["failed_in"]
                else "tight"
                if row["tight"]
                else "seeds 3-4"
                if row["needs_more_seeds"]
                else ""
            )
            text = row["assert"].replace("|", "\\|")[:70]
            print(
                f"| {row['cell']} | `{text}` | {ranges} |"
                f" {row['worst_margin']:.4g} | {row['spread']:.4g} | {flag} |"
            )
        if record is not None:
            record.mkdir(parents=True, exist_ok=True)
            runs = {
                name: {
                    "cpu_capability": r.get("info", {}).get("cpu_capability"),
                    "seconds": round(r.get("seconds", 0), 1),
                    "failures": failures(r),
                }
                for (s, name), r in results.items()
                if s == nb.stem and not r.get("missing")
            }
            (record / f"{nb.stem[:2]}.json").write_text(
                json.dumps({"runs": runs, "claims": collapse(table)}, indent=1)
                + "\n"
            )
    return 1 if any_failed else 0


def merge_records(tables: list[dict]) -> dict:
    """One chapter's recorded tables (``--record``) of sweeps run apart,
    as one: their runs together, and per assert the union of the ranges,
    the worst margin and the largest spread. A run in two tables is an
    error: the tables would count it twice."""
    runs: dict = {}
    rows: dict[tuple, dict] = {}
    for table in tables:
        twice = sorted(set(runs) & set(table["runs"]))
        if twice:
            raise ValueError(f"runs {twice} are in two tables")
        runs |= table["runs"]
        for claim in table["claims"]:
            key = claim["cell"], claim["assert"]
            if key not in rows:
                rows[key] = json.loads(json.dumps(claim))  # a copy
                continue
            row = rows[key]
            row["runs"] += claim["runs"]
            row["evaluations"] = max(row["evaluations"], claim["evaluations"])
            row["failed_in"] = sorted(
                set(row["failed_in"]) | set(claim["failed_in"])
            )
            if "worst_margin" in row and "worst_margin" in claim:
                row["worst_margin"] = min(
                    row["worst_margin"], claim["worst_margin"]
                )
                if len(row["ranges"]) == len(claim["ranges"]):
                    row["ranges"] = [
                        [min(a[0], b[0]), max(a[1], b[1])]
                        for a, b in zip(
                            row["ranges"], claim["ranges"], strict=True
                        )
                    ]
                row["spread"] = max(
                    row["spread"],
                    claim["spread"],
                    max(hi - lo for lo, hi in row["ranges"]),
                )
    claims = sorted(rows.values(), key=lambda r: r["cell"])
    return {"runs": dict(sorted(runs.items())), "claims": claims}


def merge(folders: list[Path], record: Path | None) -> int:
    """Merge the tables recorded under ``folders`` chapter by chapter,
    print each chapter's varying claims, and write them to ``record``."""
    stems = sorted(
        {p.name for f in folders for p in f.glob("[0-9][0-9].json")}
    )
    failed = False
    for name in stems:
        tables = [
            json.loads((f / name).read_text())
            for f in folders
            if (f / name).is_file()
        ]
        merged = merge_records(tables)
        print(
            f"\n{name[:2]}: {len(merged['runs'])} runs: "
            + ", ".join(merged["runs"])
        )
        print("| cell | assert | ranges | worst margin | spread | runs |")
        print("|---|---|---|---|---|---|")
        for row in merged["claims"]:
            failed |= bool(row["failed_in"])
            if row.get("spread", 0) <= 0 and not row["failed_in"]:
                continue
            ranges = ", ".join(
                f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"
                for lo, hi in row.get("ranges", [])
            )
            text = row["assert"].replace("|", "\\|")[:70]
            margin = row.get("worst_margin", float("nan"))
            failures_text = (
                f" failed in {row['failed_in']}" if row["failed_in"] else ""
            )
            print(
                f"| {row['cell']} | `{text}` | {ranges} | {margin:.4g} |"
                f" {row.get('spread', 0):.4g} | {row['runs']}{failures_text} |"
            )
        if record is not None:
            record.mkdir(parents=True, exist_ok=True)
            (record / name).write_text(json.dumps(merged, indent=1) + "\n")
    return 1 if failed else 0


def collect(folders: list[Path], record: Path | None) -> int:
    """The report of runs saved by earlier sweeps (later folders win)."""
    results, names = {}, {}
    for folder in folders:
        for path in sorted(folder.glob("*/s*-*-t*.json")):
            results[path.parent.name, path.stem] = load(path)
            names[path.stem] = None
    seeds_kernels_threads = sorted(
        (int(n.split("-")[0][1:]), n.split("-")[1], int(n.split("-")[2][1:]))
        for n in names
    )
    grid = sorted(seeds_kernels_threads, key=lambda g: (g[2], g[0], g[1]))
    stems = sorted({stem for stem, _ in results})
    notebooks = [Path(stem) for stem in stems]
    for stem in stems:  # a chapter not run in a setting: shown as missing
        for g in grid:
            results.setdefault(
                (stem, setting_name(*g)),
                {"claims": [], "errors": [], "missing": True},
            )
    # The names are as saved: a native run keeps the name it was given.
    return report(notebooks, grid, results, record, label=lambda k: k)


def words(text: str) -> list[str]:
    return text.replace(",", " ").split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--seeds", default="0 1 2")
    parser.add_argument("--kernels", default="native avx2 baseline")
    parser.add_argument("--threads", default="1 2")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("_build/sweep"))
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        help="write each chapter's claim table to DIR/NN.json",
    )
    parser.add_argument(
        "--collect",
        type=Path,
        nargs="+",
        default=None,
        help="report on the runs saved under these --out folders (no run)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="merge the tables recorded in these folders (no run); "
        "--record names where the merged ones go",
    )
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--one-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return execute(args.one.resolve(), args.one_out.resolve())
    if args.collect:
        return collect(args.collect, args.record)
    if args.merge:
        return merge(args.merge, args.record)
    if not args.notebooks:
        parser.error("name at least one notebook")
    for name in words(args.kernels):
        if name not in KERNELS:
            parser.error(
                f"unknown kernel setting {name!r}; expected one of "
                f"{', '.join(KERNELS)}"
            )
    try:
        seeds = [int(s) for s in words(args.seeds)]
        threads = [int(t) for t in words(args.threads)]
    except ValueError as error:
        parser.error(f"seeds and threads are whole numbers: {error}")
    if args.workers < 1 or any(t < 1 for t in threads):
        parser.error("workers and threads must be at least 1")
    kernels = words(args.kernels)
    native = native_capability()
    if native in kernels and "native" in kernels:
        # On this CPU that setting is the native one: the same kernels,
        # the same numbers. Its runs would repeat the native runs.
        print(
            f"{native} is this CPU's own setting: its runs are the "
            "native ones",
            flush=True,
        )
        kernels.remove(native)
    grid = plan(seeds, kernels, threads)
    results = run_all(args.notebooks, grid, args.workers, args.out.resolve())
    return report(args.notebooks, grid, results, args.record)


if __name__ == "__main__":
    sys.exit(main())
