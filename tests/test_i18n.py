"""The Chinese edition's catalogues and their check (tools/i18n.py), and
the Chinese slides' lookup (tools/slides.py): a stale, incomplete or
broken translation fails, naming the page and the message."""

import json
import sys
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import i18n  # noqa: E402 - tools/ is not a package
import slides  # noqa: E402

CITE = "{cite:t}`vaswani2017attention`"


@pytest.mark.parametrize(
    ("msgid", "msgstr", "problem"),
    [
        (f"As {CITE} show", f"如 {CITE} 所示", None),
        (f"As {CITE} show", "如论文所示", "drops the role"),
        (f"As {CITE} show", "如 {cite:t}`other2020` 所示", "drops the role"),
        (
            "Call `attend(q, k, v)` now",
            "现在调用 attend",
            "drops the inline code",
        ),
        ("The score $q \\cdot k$ is", "分数 $q k$ 是", "drops the maths"),
        (
            "See [chapter 1](01_attention)",
            "见[第 1 章](01_masks)",
            "drops the link",
        ),
        ("Note[^a] here", "注意这里", "drops the footnote"),
        ("1. Attention", "1. 注意力", "numbered list"),
        ("1. Attention", "1\\. 注意力", None),
        (
            "A plain sentence",
            "一个普通的句子，加上 `code`",
            "adds the inline code",
        ),
    ],
)
def test_entry_problems(msgid, msgstr, problem):
    found = i18n.entry_problems(msgid, msgstr)
    if problem is None:
        assert found == []
    else:
        assert any(problem in p for p in found), found


def test_code_inside_a_role_or_maths_is_not_inline_code():
    carried = i18n.carried("A {ref}`sec-x` and $`a`$ and `b`")
    assert carried[("inline code", "`b`")] == 1
    assert not any(k == "inline code" and v != "`b`" for k, v in carried)


@pytest.fixture
def locales(tmp_path, monkeypatch):
    folder = tmp_path / "zh_CN" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    monkeypatch.setattr(i18n, "LOCALES", tmp_path)
    return folder


def catalogue(path: Path, entries: list[tuple[str, str, bool]]) -> None:
    po = polib.POFile()
    for msgid, msgstr, fuzzy in entries:
        po.append(polib.POEntry(msgid=msgid, msgstr=msgstr,
                                flags=["fuzzy"] if fuzzy else []))  # fmt: skip
    po.save(str(path))


def test_complete_page_with_fuzzy_or_empty_fails(locales, capsys):
    catalogue(locales / "01_a.po", [("One", "一", False), ("Two", "二", True),
                                    ("Three", "", False)])  # fmt: skip
    assert i18n.check() == 0  # not marked complete: counted, not failed
    out = capsys.readouterr().out
    assert "01_a" in out and "    1     1     1  in progress" in out
    status = locales.parent / "status.json"
    status.write_text(json.dumps({"01_a": "complete"}))
    assert i18n.check() == 1
    out = capsys.readouterr().out
    assert "marked complete, but 1 fuzzy and 1 untranslated" in out
    assert "fuzzy: 'Two'" in out and "untranslated: 'Three'" in out


def test_broken_translation_fails_anywhere(locales, capsys):
    catalogue(locales / "02_b.po", [(f"Per {CITE}", "按论文", False)])
    assert i18n.check() == 1
    assert "drops the role" in capsys.readouterr().out


def test_status_names_a_missing_page_or_bad_state(locales, capsys):
    status = locales.parent / "status.json"
    status.write_text(json.dumps({"09_missing": "complete"}))
    assert i18n.check() == 1
    assert "09_missing is marked complete but has no catalogue" in (
        capsys.readouterr().out
    )
    status.write_text(json.dumps({"01_a": "done"}))
    with pytest.raises(SystemExit, match="'complete' or 'in progress'"):
        i18n.check()


def test_unreadable_catalogue_is_a_defect(locales, capsys):
    broken = 'msgid "a"\nmsgstr "b"\nnot a catalogue\n'
    (locales / "03_c.po").write_text(broken)
    assert i18n.check() == 1
    assert "cannot be read as a catalogue" in capsys.readouterr().out


def test_edition_files(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "I18N_BUILD", tmp_path)
    config, toc = i18n.edition_files("zh_CN")
    text, contents = config.read_text(), toc.read_text()
    assert "title: transformer-lite 中文版" in text
    assert "language: zh_CN" in text and f"[{i18n.LOCALES}]" in text
    assert f"cache: {i18n.BUILD / '.jupyter_cache'}" in text
    assert "caption: 章节" in contents and "caption: Chapters" not in contents
    english, english_toc = i18n.edition_files("en")
    assert "language:" not in english.read_text()
    assert english_toc.read_text() == (i18n.NOTEBOOKS / "_toc.yml").read_text()


def test_the_book_catalogues_pass_their_check(capsys):
    """The catalogues in the repository: no broken translation, and every
    page marked complete is complete (``make translations``)."""
    assert i18n.check(quiet=True) == 0, capsys.readouterr().out


def test_every_page_has_a_catalogue():
    pages = [p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py")]
    pages += ["teaching", "glossary", "bibliography", "syllabus"]
    folder = i18n.LOCALES / "zh_CN" / "LC_MESSAGES"
    missing = [p for p in pages if not (folder / f"{p}.po").exists()]
    assert not missing, f"no catalogue for {missing}: make translations-update"


def test_slides_look_up_headings_and_bullets(tmp_path, monkeypatch):
    folder = tmp_path / "zh_CN" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    catalogue(folder / "01_a.po", [
        ("1. Attention", "1\\. 注意力", False),
        ("The scores are scaled by the root of the width.",
         "分数按宽度的平方根缩放。", False),
        ("Stale bullet", "过时的", True),
    ])  # fmt: skip
    monkeypatch.setattr(slides, "LOCALES", tmp_path)
    tr = slides.Catalogue("zh_CN", "01_a")
    assert tr("1. Attention") == "1. 注意力"  # the heading's escape undone
    summary = (
        "- The scores are scaled by\n  the root of the width.\n"
        "- Stale bullet\n"
    )
    translated = "- 分数按宽度的平方根缩放。\n- Stale bullet\n"
    assert tr.markdown(summary) == translated
    assert slides.Catalogue("en", "01_a")("1. Attention") == "1. Attention"


def test_the_chapter_card_is_rebuilt_in_the_editions_language(monkeypatch):
    """A chapter's card is a cell output shared with the English build;
    the Chinese build replaces it (tools/book_extension.py): translated
    objectives and prerequisites, an untranslated one left English."""
    import book_extension
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.utils import new_document

    from transformer_lite.classroom import syllabus

    entry = syllabus()[1]
    first, second = entry.objectives[:2]
    catalogue = {" ".join(first.split()): "第一个目标", entry.maths: "数学"}
    document = new_document("01_attention", get_default_settings())
    card = nodes.container(classes=["cell_output"])
    card += nodes.paragraph(
        "", "", nodes.strong(text=book_extension.CARD_HEADING)
    )
    document += card

    class App:  # what translate_card reads of Sphinx's application
        class config:
            language = "zh_CN"

    monkeypatch.setattr(
        book_extension, "syllabus_catalogue", lambda app: catalogue
    )
    book_extension.translate_card(App, document, "01_attention")
    text = card.astext()
    assert "学完本章，你将能够：" in text
    assert book_extension.CARD_HEADING not in text
    assert "第一个目标" in text and second in text  # the second: English
    assert "先修：无需先读其他章节；数学。" in text
    assert f"阅读约 {entry.reading_minutes} 分钟" in text
    App.config.language = "en"  # the English build keeps its card
    english = nodes.container(classes=["cell_output"])
    english += nodes.paragraph(
        "", "", nodes.strong(text=book_extension.CARD_HEADING)
    )
    document += english
    book_extension.translate_card(App, document, "01_attention")
    assert english.astext() == book_extension.CARD_HEADING


def test_the_single_page_build_finds_each_cards_chapter(monkeypatch):
    """In the PDF's single-page build every page sits in the root's
    doctree, each inside a start_of_file marker naming its page."""
    import book_extension
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.utils import new_document
    from sphinx import addnodes

    from transformer_lite.classroom import syllabus

    monkeypatch.setattr(book_extension, "syllabus_catalogue", lambda app: {})
    document = new_document("00_preface", get_default_settings())
    page = addnodes.start_of_file(docname="02_masks")
    card = nodes.container(classes=["cell_output"])
    card += nodes.paragraph(
        "", "", nodes.strong(text=book_extension.CARD_HEADING)
    )
    page.children = [card]  # as Sphinx's inline_all_toctrees: no parent
    document += page

    class App:
        class config:
            language = "zh_CN"

    book_extension.translate_card(App, document, "00_preface")
    assert syllabus()[2].objectives[0] in card.astext()
    assert "先修：第 1 章" in card.astext()
