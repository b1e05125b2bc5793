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

Run after ``make book``: ``.venv/bin/python tools/slides.py``
(``make slides`` does).
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


def section_slides(section: dict) -> str:
    title = MARKDOWN.renderInline(section["title"])
    text = "\n\n".join(section["text"])
    if section["title"] == "Summary":
        body = MARKDOWN.render(re.sub(r"^## Summary\s*", "", text))
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


def deck(notebook, objectives: list[str], static: str = "../_static") -> str:
    """The chapter's deck as one HTML page."""
    title_cell = next(c for c in notebook.cells if heading(c))
    title = heading(title_cell)[1]
    goals = "".join(f"<li>{MARKDOWN.renderInline(g)}</li>" for g in objectives)
    slides = [f'<section><h1>{html.escape(title)}</h1>'
              f'<p class="goals">After this chapter you can:</p>'
              f"<ul>{goals}</ul></section>"]  # fmt: skip
    kept = [s for s in sections(notebook) if s["title"] not in LEFT_OUT]
    slides += [section_slides(s) for s in kept]
    slides.append("<section><h2>Exercises</h2><p>The chapter ends with "
                  "exercises and graded exercises: open it in the book or "
                  "in Jupyter.</p></section>")  # fmt: skip
    return TEMPLATE.format(title=html.escape(title), static=static,
                           slides="\n".join(slides))  # fmt: skip


TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}: slides</title>
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


def build(executed: Path = EXECUTED, out: Path = OUT) -> list[Path]:
    """Write a deck for every executed chapter in ``executed``."""
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
        page = deck(notebook, list(goals[int(path.name[:2])].objectives))
        target = out / f"{path.stem}.html"
        target.write_text(page)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executed", type=Path, default=EXECUTED)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for path in build(args.executed, args.out):
        size = path.stat().st_size / 2**10
        print(f"{path}: {size:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
