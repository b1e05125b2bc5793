"""The timing of ``make test``'s phases (tools/test_phases.py): each
phase's seconds and status recorded, a failure passed on and reported,
and the slowest tests and chapters read from the JUnit reports."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import test_phases  # noqa: E402 - tools/ is not a package


@pytest.fixture
def build(tmp_path, monkeypatch):
    monkeypatch.setattr(test_phases, "BUILD", tmp_path)
    monkeypatch.setattr(test_phases, "PHASES", tmp_path / "phases.tsv")
    monkeypatch.setattr(test_phases, "UNIT_REPORT", tmp_path / "unit.xml")
    monkeypatch.setattr(test_phases, "NBVAL_REPORT", tmp_path / "nbval.xml")
    return tmp_path


def junit(path: Path, cases: list[tuple[str, str, float]]) -> None:
    rows = "".join(
        f'<testcase classname="{c}" name="{n}" file="{c}" time="{t}"/>'
        for c, n, t in cases
    )
    path.write_text(f"<testsuites><testsuite>{rows}</testsuite></testsuites>")


def test_phases_are_recorded_in_order_and_a_failure_is_passed_on(
    build, capsys
):
    python = sys.executable
    assert test_phases.main(["run", "ok", "--", python, "-c", "pass"]) == 0
    failing = [python, "-c", "raise SystemExit(3)"]
    assert test_phases.main(["run", "broken", "--", *failing]) == 3
    names = [(n, status) for n, _, status in test_phases.read_phases()]
    assert names == [("ok", 0), ("broken", 3)]
    out = capsys.readouterr().out
    assert "phase broken failed (exit status 3)" in out
    assert "| broken |" in out and "FAILED (3)" in out
    test_phases.main(["start"])
    assert test_phases.read_phases() == []


def test_the_report_names_the_slowest_tests_and_chapters(build, capsys):
    (build / "phases.tsv").write_text("unit\t250.0\t0\nnbval\t600.4\t0\n")
    cases = [("tests.test_a", f"t{i}", float(i)) for i in range(12)]
    junit(build / "unit.xml", cases)
    junit(build / "nbval.xml", [
        ("notebooks/07_translation.ipynb", "Cell 1", 100.0),
        ("notebooks/07_translation.ipynb", "Cell 2", 50.0),
        ("notebooks/02_masks.ipynb", "Cell 1", 9.0),
    ])  # fmt: skip
    assert test_phases.main(["report"]) == 0
    out = capsys.readouterr().out
    assert "| total | 850 | 14.2 min |" in out
    slow = [line for line in out.splitlines() if "tests.test_a::" in line]
    assert len(slow) == 10 and slow[0] == "| tests.test_a::t11 | 11.0 |"
    assert "| 07 | 150 |" in out and "| 02 | 9 |" in out


def test_a_phase_without_a_command_is_refused(build):
    assert test_phases.main(["run", "empty", "--"]) == 2
    assert test_phases.read_phases() == []
