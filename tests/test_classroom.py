"""The classroom edition's pieces: the checkers say what is wrong, the
syllabus covers every chapter with measured times, and a slide deck is
cut from a chapter as its docstring says."""

import json
import math
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from transformer_lite.classroom import (
    WrongAnswer,
    chapter_card,
    expect,
    expect_close,
    expect_equal,
    expect_raises,
    expect_tensor,
    syllabus,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import chapter_times  # noqa: E402 - tools/ is not a package
import slides  # noqa: E402

CHAPTERS = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.py"))


def message(check) -> str:
    with pytest.raises(WrongAnswer) as raised:
        check()
    return str(raised.value)


def test_checkers_name_the_first_thing_wrong():
    want = torch.ones(2, 3)
    assert message(lambda: expect_close("w", [1.0], want)) == (
        "w should be a torch.Tensor, got list."
    )
    assert message(lambda: expect_close("w", torch.ones(3, 2), want)) == (
        "w has shape (3, 2); expected (2, 3)."
    )
    nan = torch.ones(2, 3)
    nan[1, 2] = math.nan
    assert "1 non-finite value (NaN), the first at index (1, 2)" in message(
        lambda: expect_close("w", nan, want)
    )
    off = want.clone()
    off[0, 1] = 1.5
    text = message(lambda: expect_close("w", off, want, hint="look"))
    assert "largest difference is 0.5, at index (0, 1)" in text
    assert text.endswith("\nHint: look")
    assert message(lambda: expect_tensor("x", want, dtype=torch.int64)) == (
        "x has dtype torch.float32; expected torch.int64."
    )
    ids = torch.tensor([1, 2, 3])
    assert "differs in 2 places, the first at index (0,)" in message(
        lambda: expect_equal("ids", ids, torch.tensor([0, 2, 0]))
    )
    assert message(lambda: expect_equal("n", 3, 4)) == "n is 3; expected 4."
    assert message(lambda: expect(False, "no")) == "no"


def test_checkers_pass_what_is_right():
    x = torch.randn(3, 4, dtype=torch.float64)
    expect_close("x", x + 1e-12, x)
    inf = torch.tensor([-math.inf, 0.0])
    expect_close("inf", inf.clone(), inf)  # equal infinities are equal
    expect_equal("x", x.clone(), x)
    expect_raises(ValueError, lambda: int("x"), match="invalid literal")
    assert expect_tensor("x", x, shape=(3, 4), dtype=torch.float64) is x


def test_expect_raises_explains_what_happened_instead():
    assert "nothing was raised" in message(
        lambda: expect_raises(ValueError, lambda: 1)
    )
    assert "got KeyError" in message(
        lambda: expect_raises(ValueError, lambda: {}["a"])
    )
    assert "does not match 'shape'" in message(
        lambda: expect_raises(ValueError, lambda: int("x"), match="shape")
    )
    with pytest.raises(NotImplementedError):  # a stub is not a wrong answer
        expect_raises(ValueError, _stub)


def _stub():
    raise NotImplementedError()


def test_the_syllabus_covers_every_chapter_with_measured_times():
    entries = syllabus()
    numbers = [int(p.name[:2]) for p in CHAPTERS if p.name[:2] != "00"]
    assert sorted(entries) == numbers
    for number, entry in entries.items():
        assert 3 <= len(entry.objectives) <= 5, number
        assert all(c < number for c in entry.chapters), number
        assert entry.maths and entry.running_seconds > 0
    for path in CHAPTERS[1:]:  # reading time as tools/chapter_times.py
        counted = chapter_times.reading_minutes(path)
        stored = entries[int(path.name[:2])].reading_minutes
        assert abs(stored - counted) <= 0.25 * counted, (
            f"{path.name}: {stored} min stored, {counted} counted: "
            "run make chapter-times"
        )


def test_chapter_card_lists_objectives_prerequisites_and_times():
    card = chapter_card(7).data
    for objective in syllabus()[7].objectives:
        assert f"- {objective}" in card
    assert "**Before it:** chapter 6;" in card and "to run on one CPU" in card
    assert "chapters 5, 7 and 10" in chapter_card(11).data
    with pytest.raises(ValueError, match="no chapter 99"):
        chapter_card(99)


def test_running_times_come_from_the_junit_report(tmp_path):
    cases = [
        ("notebooks.01_attention.ipynb", "Cell 0", 2.5),
        ("notebooks.01_attention.ipynb", "Cell 1", 3.0),
        ("notebooks.07_translation.ipynb", "Cell 0", 9),
        ("tests.test_assignments", "test_kit", 60),
        ("tests.test_assignments", "test_a[07_translation.py]", 30),
        ("tests.test_assignments", "test_b[trivial-07_translation.py]", 4),
        ("tests.test_assignments", "test_a[01_attention.py]", 5),
    ]
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        + "".join(
            f'<testcase classname="{where}" name="{name}" time="{seconds}"/>'
            for where, name, seconds in cases
        )
        + "</testsuite></testsuites>"
    )
    assert chapter_times.running_seconds(report) == {
        "01": 6,
        "07": 9,
        "assignments": 60,
        "07 grading": 34,
        "01 grading": 5,
    }


def test_a_deck_is_cut_from_the_executed_chapter(tmp_path):
    v4 = nbformat.v4
    png = "iVBORw0KGgo="  # any base64 will do for the page's structure
    figure = v4.new_output("display_data", data={"image/png": png})
    cells = [
        v4.new_markdown_cell("# 3. A chapter\n\nIntro."),
        v4.new_markdown_cell("## Scores\n\nText $a_1$.\n\n$$x^2_i$$"),
        v4.new_code_cell("plot()", outputs=[figure]),
        v4.new_code_cell(
            "hidden()", outputs=[figure], metadata={"tags": ["remove-output"]}
        ),  # fmt: skip
        v4.new_markdown_cell(
            "Closing words.\n\n## Summary\n\n- one *point*"
            "\n- two\n\n## Exercises\n\n1. Do $$z$$"
        ),
        v4.new_markdown_cell("## Graded exercises\n\n$$y$$"),
    ]
    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(v4.new_notebook(cells=cells), executed / "03_x.ipynb")
    page = slides.deck(nbformat.read(executed / "03_x.ipynb", 4), ["Do."])
    assert "<h1>3. A chapter</h1>" in page and "<li>Do.</li>" in page
    assert page.count("data:image/png;base64") == 1  # remove-output not
    assert '<div class="math">\\[x^2_i\\]</div>' in page
    assert '<section class="summary"><h2>Summary</h2>' in page
    assert "<em>point</em>" in page and "\\[y\\]" not in page
    assert "\\[z\\]" not in page and "Closing words" not in page
    assert "http" not in page.replace("http-equiv", "")
    data = json.dumps(page)
    assert "../_static/reveal/reveal.js" in data


def test_make_nbval_hands_out_the_longest_work_first():
    """tools/whole_chapters.py: a chapter's cells are one piece of work,
    in their order, and so is each chapter's grading; the pieces go
    longest first by timings.json, the unmeasured last."""
    import whole_chapters

    timings = json.loads(chapter_times.TIMINGS.read_text())
    grading = "tests/test_assignments.py::test_{}[{}07_translation.py]"
    nodeids = [
        "notebooks/01_attention.ipynb::Cell 0",
        "notebooks/07_translation.ipynb::Cell 0",
        "notebooks/01_attention.ipynb::Cell 1",
        grading.format("scores", ""),
        "notebooks/99_unmeasured.ipynb::Cell 0",
        "tests/test_assignments.py::test_the_student_kit",
        grading.format("cheat", "trivial-"),
        "notebooks/07_translation.ipynb::Cell 1",
    ]
    groups = [whole_chapters.group_of(n) for n in nodeids]
    assert groups == ["01", "07", "01", "07 grading", "99", "assignments",
                      "07 grading", "07"]  # fmt: skip
    order = whole_chapters.longest_first(nodeids)
    ran = [groups[i] for i in order]
    seconds = [chapter_times.expected_seconds(g, timings) for g in ran]
    assert seconds == sorted(seconds, reverse=True)
    assert ran[:2] == ["07", "07"] and ran[-1] == "99"
    assert [nodeids[i] for i in order if groups[i] == "01"] == [
        nodeids[0], nodeids[2]
    ]  # fmt: skip
    assert seconds[0] == timings["07"]["running_seconds"] > 0
    runs = [g for k, g in enumerate(ran) if k == 0 or ran[k - 1] != g]
    assert len(runs) == len(set(runs)), f"a group split: {ran}"


def test_a_syllabus_objective_number_must_exist():
    import importlib

    module = importlib.import_module("transformer_lite.classroom.syllabus")

    entry = {"objectives": ["a", "b"], "chapters": [], "maths": "",
             "exercises": {"1": [3]}}  # fmt: skip
    with pytest.raises(ValueError, match="exercise 1: objectives .3."):
        module._exercises("07", entry)
    assert module._exercises("07", {**entry, "exercises": {"2": [2, 1]}}) \
        == {2: (2, 1)}  # fmt: skip
