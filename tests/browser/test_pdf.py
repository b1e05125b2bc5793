"""The PDF of each edition (``make pdf``, tools/pdf.py).

Each PDF must exist with the summary tools/pdf.py wrote beside it (no
request outside the book while printing, every formula typeset, every
chart drawn); open with a table of contents that lists every chapter;
start each chapter on a page of its own, in reading order, with the
chapter's title as text (Chinese titles in the Chinese PDF); and carry an
outline (the reader's bookmarks) with every chapter in it.
"""

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import polib
import pytest
from pypdf import PdfReader

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PDF = ROOT / "_build" / "pdf"
CATALOGUES = NOTEBOOKS / "locales" / "zh_CN" / "LC_MESSAGES"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
EDITIONS = {  # file -> (language, the contents page's heading)
    "transformer-lite.pdf": ("en", "Contents"),
    "transformer-lite-zh.pdf": ("zh_CN", "目录"),
}


def english_title(chapter: str) -> str:
    first = jupytext.read(NOTEBOOKS / f"{chapter}.py").cells[0].source
    return first.splitlines()[0].removeprefix("# ").strip()


def title(chapter: str, language: str) -> str:
    english = english_title(chapter)
    if language == "en":
        return english
    entry = polib.pofile(str(CATALOGUES / f"{chapter}.po")).find(english)
    assert entry is not None and entry.msgstr, f"{chapter}: title untranslated"
    return entry.msgstr.replace("\\.", ".")


def flat(text: str) -> str:
    """Text as compared: no spaces (the PDF's text breaks lines anywhere
    and spaces Chinese freely), its ligatures (ﬁ, ﬀ, ﬄ) undone, no
    markup."""
    text = unicodedata.normalize("NFKC", text)
    return re.sub(r"\s+", "", text.replace("*", ""))


@dataclass
class Edition:
    language: str
    contents: str  # the contents page's heading
    reader: PdfReader
    summary: dict
    texts: dict = field(default_factory=dict)

    def text(self, page: int) -> str:
        """One page's text, flattened (extracted once: 30 s for them all)."""
        if page not in self.texts:
            raw = self.reader.pages[page].extract_text() or ""
            self.texts[page] = flat(raw)
        return self.texts[page]

    def bookmarks(self) -> dict[str, int]:
        """The outline's entries, flattened title -> page (0-based)."""
        marks = {}

        def walk(outline):
            for item in outline:
                if isinstance(item, list):
                    walk(item)
                else:
                    page = self.reader.get_destination_page_number(item)
                    marks.setdefault(flat(item.title), page)

        walk(self.reader.outline)
        return marks


@pytest.fixture(scope="module", params=sorted(EDITIONS))
def edition(request) -> Edition:
    path = PDF / request.param
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make pdf`")
    summary = json.loads(path.with_suffix(".json").read_text())
    return Edition(*EDITIONS[request.param], PdfReader(str(path)), summary)


def test_the_pdf_was_printed_offline_and_whole(edition):
    summary = edition.summary
    assert summary["outside_requests"] == []
    assert summary["math_errors"] == 0 and summary["formulas"] > 100
    assert summary["charts_left"] == 0
    assert summary["pages"] == len(edition.reader.pages)
    assert summary["chapters"] >= len(CHAPTERS)


def test_the_outline_has_every_chapter_on_a_page_of_its_own(edition):
    """Each chapter's bookmark leads to a page that starts with the
    chapter's title, in reading order, one chapter to a page."""
    marks = edition.bookmarks()
    starts = []
    for chapter in CHAPTERS:
        wanted = flat(title(chapter, edition.language))
        assert wanted in marks, f"{chapter}'s title is not in the outline"
        page = marks[wanted]
        assert edition.text(page).startswith(wanted), (
            f"{chapter}'s page {page + 1} starts "
            f"{edition.text(page)[:40]!r}, not its title"
        )
        starts.append(page)
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    last = len(edition.reader.pages) - 1
    assert 0 < starts[0] and starts[-1] < last, (
        "contents first, references last"
    )


def test_the_contents_list_every_chapter(edition):
    """The pages before the preface are the table of contents, and every
    chapter is in it."""
    preface = edition.bookmarks()[flat(title(CHAPTERS[0], edition.language))]
    assert edition.text(0).startswith(flat(edition.contents))
    front = "".join(edition.text(page) for page in range(preface))
    missing = [
        c for c in CHAPTERS if flat(title(c, edition.language)) not in front
    ]
    assert not missing, f"chapters not in the contents: {missing}"
