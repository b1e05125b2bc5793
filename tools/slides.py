"""Make a reveal.js slide deck for every chapter, from the chapter itself.

No slide is written by hand: a deck is cut out of the executed chapter
(``_build/html/_sources/NN_name.ipynb``, the download with outputs that
``make book`` writes):

* a title slide: the chapter's title and its objectives (the syllabus);
* one slide per section (``## `` heading): the heading and the section's
  display equations, at most ``MAX_EQUATIONS``;
* below it, one slide per figure the section draws (its PNG and SVG
  outputs; the interactive charts stay in the book);
* the summary section whole, its bullets one slide; the exercise
  sections are left out, and a last slide points to them.

Each deck is one HTML file in ``_build/html/slides/`` that loads reveal.js
and MathJax from the book's own ``_static`` folder (``tools/book_assets.py``
fetches both), so the slides work offline from the built site. The figures
are embedded as data URIs.

The Chinese edition's decks (``--language zh_CN``, into
``_build/html/zh/slides/``) are cut from the same executed chapters; each
heading and each bullet of the summary is looked up in the chapter's
catalogue (``notebooks/locales/zh_CN/LC_MESSAGES``), the same messages
the Chinese book shows, and stays English where it has no translation
yet.

Run after ``make book`` (and ``make book-zh``):
``.venv/bin/python tools/slides.py`` (``make slides`` does both).
"""

import argparse
import html
import re
import sys
from pathlib import Path

import nbformat
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "_build" / "html" / "_sources"
OUT = ROOT / "_build" / "html" / "slides"
LOCALES = ROOT / "notebooks" / "locales"
# Each edition's words of the deck itself; its folder under _build/html.
WORDS = {
    "en": {"lang": "en", "goals": "After this chapter you can:",
           "exercises": "Exercises", "slides": "slides",
           "pointer": "The chapter ends with exercises and graded exercises: "
                      "open it in the book or in Jupyter.",
           "summary": "Summary"},
    "zh_CN": {"lang": "zh-CN", "goals": "学完本章，你能够：",
              "exercises": "练习", "slides": "幻灯片",
              "pointer": "本章最后有练习和评分练习：请在书中或在 Jupyter "
                         "里打开本章。",
              "summary": "小结"},
}  # fmt: skip
EDITION_FOLDER = {"en": "", "zh_CN": "zh"}
MAX_EQUATIONS = 3
LEFT_OUT = ("Exercises", "Graded exercises")
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)


def render_math(content: str, options: dict) -> str:
    """MathJax's own delimiters, so that markdown leaves the TeX alone."""
    tex = html.escape(content)
    if options.get("display_mode"):
        return f'<div class="math">\\[{tex}\\]</div>\n'
    return f"\\({tex}\\)"


MARKDOWN = MarkdownIt("commonmark")
MARKDOWN.use(dollarmath_plugin, renderer=render_math)


def heading(cell) -> tuple[int, str] | None:
    """(level, text) of a markdown cell that opens with a heading."""
    match = re.match(r"(#{1,3}) (.+)", cell.source.lstrip())
    if cell.cell_type != "markdown" or not match:
        return None
    return len(match.group(1)), match.group(2).strip()


class Catalogue:
    """A chapter's translations (msgid -> msgstr), looked up with the
    whitespace of both sides made single spaces; English where there is
    none, or where it is fuzzy."""

    def __init__(self, language: str, page: str) -> None:
        self.messages: dict[str, str] = {}
        path = LOCALES / language / "LC_MESSAGES" / f"{page}.po"
        if language == "en" or not path.exists():
            return
        import polib

        for entry in polib.pofile(str(path)):
            if entry.msgstr and not entry.obsolete and "fuzzy" not in entry.flags:
                self.messages[" ".join(entry.msgid.split())] = entry.msgstr

    def __call__(self, text: str) -> str:
        found = self.messages.get(" ".join(text.split()))
        if found is None:
            return text
        return re.sub(r"^(\d+)\\\.", r"\1.", found)  # "1\. " was a heading

    def markdown(self, text: str) -> str:
        """Markdown with each paragraph and list item translated."""
        out, block, marker = [], [], ""

        def flush() -> None:
            if block:
                out.append(marker + self(" ".join(block)))

        for line in text.splitlines() + [""]:
            item = re.match(r"(\s*(?:[-*]|\d+\.)\s+)(.*)", line)
            if item or not line.strip():
                flush()
                block, marker = ([item.group(2)], item.group(1)) if item else ([], "")
                if not line.strip():
                    out.append("")
            else:
                block.append(line.strip())
        return "\n".join(out).strip() + "\n"


def figures(cell) -> list[str]:
    """The cell's drawn figures, as <img> tags with data URIs."""
    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data:
            png = data["image/png"].replace("\n", "")
            found.append(f'<img src="data:image/png;base64,{png}" alt="">')
        elif "image/svg+xml" in data:
            svg = "".join(data["image/svg+xml"])
            found.append(f'<div class="svg">{svg}</div>')
    return found


def parts(cell) -> list:
    """A markdown cell cut at every ``## `` heading inside it (a summary
    and the exercises often share one cell); other cells whole."""
    if cell.cell_type != "markdown":
        return [cell]
    chunks = re.split(r"(?m)^(?=## )", cell.source)
    return [nbformat.v4.new_markdown_cell(c) for c in chunks if c.strip()]


def sections(notebook) -> list[dict]:
    """The chapter cut at its ``## `` headings: for each, its title, its
    markdown text and its figures."""
    cut: list[dict] = []
    for whole in notebook.cells:
        tags = set(whole.metadata.get("tags", []))
        if "remove-cell" in tags:
            continue
        for cell in parts(whole):
            head = heading(cell)
            if head and head[0] == 2:
                cut.append({"title": head[1], "text": [], "figures": []})
            if not cut:
                continue
            if cell.cell_type == "markdown":
                cut[-1]["text"].append(cell.source)
            elif cell.cell_type == "code" and "remove-output" not in tags:
                cut[-1]["figures"] += figures(cell)
    return cut


def section_slides(section: dict, tr: Catalogue | None = None) -> str:
    tr = tr or Catalogue("en", "")
    title = MARKDOWN.renderInline(tr(section["title"]))
    text = "\n\n".join(section["text"])
    if section["title"] == "Summary":
        summary = re.sub(r"^## Summary\s*", "", text)
        body = MARKDOWN.render(tr.markdown(summary))
        return f'<section class="summary"><h2>{title}</h2>{body}</section>'
    equations = DISPLAY_MATH.findall(text)[:MAX_EQUATIONS]
    body = "".join(render_math(tex.strip(), {"display_mode": True})
                   for tex in equations)  # fmt: skip
    slides = [f"<section><h2>{title}</h2>{body}</section>"]
    for figure in section["figures"]:
        slides.append(f'<section><h3>{title}</h3><div class="figure">'
                      f"{figure}</div></section>")  # fmt: skip
    if len(slides) == 1:
        return slides[0]
    return "<section>" + "".join(slides) + "</section>"  # a vertical stack


def deck(
    notebook,
    objectives: list[str],
    static: str = "../_static",
    tr: Catalogue | None = None,
    language: str = "en",
) -> str:
    """The chapter's deck as one HTML page, in ``language``'s words."""
    tr = tr or Catalogue("en", "")
    words = WORDS[language]
    title_cell = next(c for c in notebook.cells if heading(c))
    title = tr(heading(title_cell)[1])
    goals_tr = Catalogue(language, "syllabus")  # the objectives' messages
    goals = "".join(f"<li>{MARKDOWN.renderInline(goals_tr(g))}</li>"
                    for g in objectives)  # fmt: skip
    slides = [f'<section><h1>{html.escape(title)}</h1>'
              f'<p class="goals">{words["goals"]}</p>'
              f"<ul>{goals}</ul></section>"]  # fmt: skip
    kept = [s for s in sections(notebook) if s["title"] not in LEFT_OUT]
    slides += [section_slides(s, tr) for s in kept]
    slides.append(f'<section><h2>{words["exercises"]}</h2>'
                  f'<p>{words["pointer"]}</p></section>')  # fmt: skip
    return TEMPLATE.format(title=html.escape(title), static=static,
                           lang=words["lang"], slides_word=words["slides"],
                           slides="\n".join(slides))  # fmt: skip


TEMPLATE = """<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}: {slides_word}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{static}/reveal/reveal.css">
<link rel="stylesheet" href="{static}/reveal/theme/white.css">
<style>
.reveal h1, .reveal h2, .reveal h3 {{ text-transform: none; }}
.reveal h1 {{ font-size: 1.8em; }}
.reveal h2 {{ font-size: 1.3em; }}
.reveal h3 {{ font-size: 1em; }}
.reveal ul {{ font-size: 0.6em; }}
.reveal .goals {{ font-size: 0.7em; }}
.reveal .summary ul {{ font-size: 0.45em; }}
.reveal .figure img, .reveal .svg svg {{ max-height: 540px; }}
</style>
<script>
window.MathJax = {{ tex: {{ inlineMath: [["\\\\(", "\\\\)"]] }} }};
</script>
<script src="{static}/mathjax/tex-chtml.js" defer></script>
</head>
<body>
<div class="reveal"><div class="slides">
{slides}
</div></div>
<script src="{static}/reveal/reveal.js"></script>
<script>Reveal.initialize({{ hash: true, center: true }});</script>
</body>
</html>
"""


def build(
    executed: Path = EXECUTED, out: Path = OUT, language: str = "en"
) -> list[Path]:
    """Write a deck for every executed chapter in ``executed``."""
    if language not in WORDS:
        raise SystemExit(f"no slides for language {language!r}: expected "
                         f"one of {sorted(WORDS)}")  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from transformer_lite.classroom import syllabus

    goals = syllabus()
    paths = sorted(executed.glob("[0-9][0-9]_*.ipynb"))
    paths = [p for p in paths if int(p.name[:2]) in goals]
    if not paths:
        raise SystemExit(f"no executed chapters in {executed}: make book")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        page = deck(notebook, list(goals[int(path.name[:2])].objectives),
                    tr=Catalogue(language, path.stem), language=language)  # fmt: skip
        target = out / f"{path.stem}.html"
        target.write_text(page)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executed", type=Path, default=EXECUTED)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: the edition's slides/ folder")  # fmt: skip
    parser.add_argument("--language", default="en", choices=sorted(WORDS))
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = ROOT / "_build" / "html" / EDITION_FOLDER[args.language] / "slides"
    for path in build(args.executed, out, args.language):
        size = path.stat().st_size / 2**10
        print(f"{path}: {size:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
