"""The sweep's claim recorder (tools/sweep_claims.py) and its tables
(tools/seed_sweep.py): every top-level assert of a chapter is recorded
with its values instead of raising, asserts inside functions are left as
they are, and the margins and grid are what the Makefile documents."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import seed_sweep  # noqa: E402 - tools/ is not a package
import sweep_claims  # noqa: E402


@pytest.fixture
def recorded():
    """Run source through the rewriting and return the records."""
    sweep_claims._records.clear()
    sweep_claims._occurrence.clear()

    def run(source: str) -> list[dict]:
        tree = sweep_claims.RecordAsserts().visit(ast.parse(source))
        namespace = {sweep_claims.RECORDER: sweep_claims}
        exec(compile(tree, "<cell>", "exec"), namespace)  # noqa: S102
        return list(sweep_claims._records)

    yield run
    sweep_claims._records.clear()
    sweep_claims._occurrence.clear()


def test_a_failing_assert_is_recorded_with_its_values_and_goes_on(recorded):
    records = recorded(
        "import torch\n"
        "accuracy = torch.tensor(0.9644)\n"
        "assert accuracy >= 0.965, accuracy\n"
        "assert 0.5 < 0.7 < 1\n"
        "after = True\n"
        "assert after\n"
    )
    first, chained, plain = records
    assert first["text"] == "accuracy >= 0.965"
    assert first["ops"] == [">="] and not first["passed"]
    assert first["values"] == pytest.approx([0.9644, 0.965])
    assert chained["ops"] == ["<", "<"] and chained["passed"]
    assert plain == {**plain, "ops": [], "values": [], "passed": True}


def test_a_conjunction_of_comparisons_is_two_claims(recorded):
    """``early > 0.85 and past < 0.25`` hid both values; each side is now
    a claim of its own, with its values, even after the first fails."""
    first, second = recorded(
        "early, past = 0.57, 0.13\nassert early > 0.85 and past < 0.25\n"
    )
    assert first["text"] == "early > 0.85" and not first["passed"]
    assert first["values"] == pytest.approx([0.57, 0.85])
    assert second["text"] == "past < 0.25" and second["passed"]
    other = recorded("x = [1]\nassert x and len(x) == 1\n")[-1]
    assert other["ops"] == [] and other["passed"]  # not all comparisons


def test_asserts_in_functions_are_code_and_still_raise(recorded):
    source = "def check(x):\n    assert x > 0, 'positive'\n\ncheck(-1)\n"
    with pytest.raises(AssertionError, match="positive"):
        recorded(source)


def test_a_loop_records_each_pass(recorded):
    records = recorded("for d in (1, 2, 3):\n    assert d < 3\n")
    assert [r["n"] for r in records] == [0, 1, 2]
    assert [r["passed"] for r in records] == [True, True, False]


def test_values_that_are_not_numbers_are_kept_as_none(recorded):
    (record,) = recorded("assert 'a' in ['a', 'b']\n")
    assert record["values"] == [None, None] and record["passed"]


def test_margins_point_the_way_of_the_comparison():
    def margin(values, ops):
        return seed_sweep.margin_of({"values": values, "ops": ops})

    assert margin([0.97, 0.95], [">="]) == pytest.approx(0.02)
    assert margin([0.03, 0.05], ["<"]) == pytest.approx(0.02)
    assert margin([0.8, 1.0, 1.25], ["<", "<"]) == pytest.approx(0.2)
    assert margin([0.96, 0.97], [">"]) == pytest.approx(-0.01)
    assert margin([1.0, 1.0], ["=="]) is None


def test_the_claim_table_finds_the_worst_run_and_flags_a_tight_floor():
    def run(value):
        claim = {"cell": 3, "text": "acc >= 0.9", "n": 0, "ops": [">="]}
        claim.update(values=[value, 0.9], passed=value >= 0.9)
        return {"claims": [claim], "errors": []}

    results = {("ch", "a"): run(0.95), ("ch", "b"): run(0.99)}
    (row,) = seed_sweep.claim_table("ch", results)
    assert row["worst_margin"] == pytest.approx(0.05)
    assert row["spread"] == pytest.approx(0.04)
    assert not row["tight"] and row["needs_more_seeds"]  # 0.05 < 2 x 0.04
    results["ch", "c"] = run(0.905)
    (row,) = seed_sweep.claim_table("ch", results)
    assert row["tight"]  # 0.005 above the floor, spread 0.085


def test_the_grid_is_seeds_by_kernels_then_seeds_by_threads():
    grid = seed_sweep.plan([0, 1, 2], ["native", "avx2", "baseline"], [1, 2])
    assert len(grid) == 12
    assert grid.count((0, "native", 1)) == 1
    assert [g for g in grid if g[2] == 2] == [
        (s, "native", 2) for s in (0, 1, 2)
    ]
    # Without one thread, only the other thread counts (to extend a sweep).
    assert seed_sweep.plan([0, 1], ["native", "baseline"], [2]) == [
        (0, "native", 2),
        (1, "native", 2),
    ]
    assert set(seed_sweep.KERNELS) >= {"native", "avx2", "baseline"}
    for name, variables in seed_sweep.KERNELS.items():
        assert name == "native" or set(variables) == {
            "ATEN_CPU_CAPABILITY",
            "MKL_ENABLE_INSTRUCTIONS",
            "ONEDNN_MAX_CPU_ISA",
        }


def test_every_kernel_setting_has_an_inductor_cache_of_its_own(tmp_path):
    envs = {
        k: seed_sweep.job_env(1, k, 2, tmp_path) for k in seed_sweep.KERNELS
    }
    caches = {env["TORCHINDUCTOR_CACHE_DIR"] for env in envs.values()}
    assert len(caches) == len(seed_sweep.KERNELS)
    avx2 = envs["avx2"]
    assert avx2["ATEN_CPU_CAPABILITY"] == "avx2" and avx2["BOOK_SEED"] == "1"
    assert avx2["OMP_NUM_THREADS"] == avx2["MKL_NUM_THREADS"] == "2"


def test_a_native_run_is_named_by_what_the_cpu_picked():
    import torch

    here = torch.backends.cpu.get_cpu_capability().lower()
    assert seed_sweep.shown("native") == here != "native"
    assert seed_sweep.shown("baseline") == "baseline"
    assert seed_sweep.setting_name(0, seed_sweep.shown("native"), 2) == (
        f"s0-{here}-t2"
    )


def test_a_loop_collapses_to_one_row_with_its_worst_pass():
    def claim(n, value):
        return {"cell": 1, "text": "d < 3", "n": n, "ops": ["<"],
                "values": [value, 3.0], "passed": value < 3}  # fmt: skip

    results = {
        ("ch", "a"): {"claims": [claim(0, 1.0), claim(1, 2.5)]},
        ("ch", "b"): {"claims": [claim(0, 1.5), claim(1, 2.0)]},
    }
    (row,) = seed_sweep.collapse(seed_sweep.claim_table("ch", results))
    assert row["evaluations"] == 2 and row["failed_in"] == []
    assert row["worst_margin"] == pytest.approx(0.5)
    assert row["ranges"] == [[1.0, 2.5], [3.0, 3.0]]


def test_tables_of_sweeps_run_apart_merge_into_one():
    def table(runs, value, failed=()):
        return {
            "runs": {name: {"seconds": 1.0} for name in runs},
            "claims": [
                {
                    "cell": 3,
                    "assert": "acc >= 0.9",
                    "evaluations": 1,
                    "runs": len(runs),
                    "failed_in": list(failed),
                    "worst_margin": value[0] - 0.9,
                    "spread": value[1] - value[0],
                    "ranges": [list(value), [0.9, 0.9]],
                }
            ],
        }

    one = table(["s0-native-t1", "s1-native-t1"], (0.95, 0.97))
    two = table(["s0-native-t2"], (0.93, 0.93), failed=["s0-native-t2"])
    merged = seed_sweep.merge_records([one, two])
    (row,) = merged["claims"]
    assert list(merged["runs"]) == [
        "s0-native-t1",
        "s0-native-t2",
        "s1-native-t1",
    ]
    assert row["runs"] == 3 and row["failed_in"] == ["s0-native-t2"]
    assert row["ranges"] == [[0.93, 0.97], [0.9, 0.9]]
    assert abs(row["worst_margin"] - 0.03) < 1e-12
    assert abs(row["spread"] - 0.04) < 1e-12  # over both tables' values
    with pytest.raises(ValueError, match="in two tables"):
        seed_sweep.merge_records([one, one])
