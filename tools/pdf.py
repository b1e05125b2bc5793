"""One PDF per edition of the book (``make pdf``), offline.

Each edition is built once more as a single HTML page (Sphinx's
``singlehtml`` builder, from the English build's execution cache: no
chapter runs again), opened in headless Chromium (Debian's, driven by
``playwright`` as the browser tests drive it) from a server on
127.0.0.1 that answers nothing outside the page, and printed once its
maths is typeset and its charts are drawn. Before printing, a table of
contents of the chapters and their sections is put at the front, each
entry a link; the PDF's outline (the reader's bookmarks) is written from
the same entries, each at the page its link leads to. Every page of the
book starts on a new sheet; the footer numbers the sheets.

::

    python tools/pdf.py             # both editions -> _build/pdf/*.pdf
    python tools/pdf.py --language zh_CN

Run after ``make book`` (and ``make book-zh`` for the Chinese PDF).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import i18n  # noqa: E402  (tools/i18n.py: the editions' configs)

ROOT = i18n.ROOT
OUT = ROOT / "_build" / "pdf"
# The edition's language -> its PDF and the words of its front matter.
EDITIONS = {
    "en": ("transformer-lite.pdf", "Contents"),
    "zh_CN": ("transformer-lite-zh.pdf", "目录"),
}
WAIT_MS = 240_000  # the whole book's maths, typeset in one page

# Run in the page before printing: wait for MathJax and the charts.
TYPESET = """async () => {
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  const charts = () => [...document.querySelectorAll('div[id^="altair-viz-"]')]
    .filter(c => !c.querySelector("svg, canvas")).length;
  for (let i = 0; i < 600 && charts(); i++)
    await new Promise(r => setTimeout(r, 100));
  const images = [...document.images];
  images.forEach(i => { i.loading = "eager"; });
  await Promise.all(images.map(i => i.decode().catch(() => null)));
  return {
    math: document.querySelectorAll("mjx-container").length,
    errors: document.querySelectorAll("mjx-merror").length,
    charts_left: charts(),
  };
}"""

# The front matter: a linked table of contents of the book's pages and
# their sections. In the single page every page of the book is a section of
# class tex2jax_ignore, nested where the toctree sat; they are moved to
# the top level, in order. Sphinx's single page repeats section ids from
# page to page (every chapter has its "summary"): a repeated id gets the
# page's id in front, and the page's own links to it follow. Returns the
# entries, for the outline (tools/pdf.py writes it: Chromium's own repeats
# some headings' text and runs a wrapped heading's lines together).
CONTENTS = """(heading) => {
  const main = document.querySelector("main article, article, main");
  const name = (h) => h.textContent.replace(/[#\u00b6]\\s*$/, "").trim();
  const link = (text, id) => {
    const item = document.createElement("li");
    item.innerHTML = '<a href="#' + id + '"></a>';
    item.firstChild.textContent = text;
    return item;
  };
  const docs = [...main.querySelectorAll("section.tex2jax_ignore")]
    .filter((doc) => doc.id && doc.querySelector(":scope > h1, :scope > h2"));
  const seen = new Set();
  for (const doc of docs) {
    for (const s of [doc, ...doc.querySelectorAll("[id]")]) {
      if (s.closest("section.tex2jax_ignore") !== doc && s !== doc) continue;
      if (!seen.has(s.id)) { seen.add(s.id); continue; }
      const old = s.id;
      s.id = doc.id + "--" + old;
      seen.add(s.id);
      for (const a of doc.querySelectorAll('a[href="#' + old + '"]'))
        a.setAttribute("href", "#" + s.id);
    }
  }
  const nav = document.createElement("nav");
  nav.className = "tl-pdf-contents";
  nav.innerHTML = "<h2></h2>";
  nav.firstChild.textContent = heading;
  const list = document.createElement("ul");
  const entries = [];
  for (const doc of docs) {
    main.appendChild(doc);  // in order, each at the top level
    doc.classList.add("tl-pdf-page");
    const h = doc.querySelector(":scope > h1, :scope > h2");
    const entry = {title: name(h), id: doc.id, sections: []};
    const item = link(entry.title, doc.id);
    const sections = document.createElement("ul");
    for (const s of doc.querySelectorAll(
        ":scope > section:not(.tex2jax_ignore)")) {
      const sh = s.querySelector(":scope > h2, :scope > h3");
      if (!sh || !s.id) continue;
      entry.sections.push({title: name(sh), id: s.id});
      sections.appendChild(link(name(sh), s.id));
    }
    if (sections.children.length) item.appendChild(sections);
    list.appendChild(item);
    entries.push(entry);
  }
  nav.appendChild(list);
  main.prepend(nav);
  return entries;
}"""

PRINT_CSS = """
@page { size: A4; margin: 18mm 16mm 20mm 16mm; }
.bd-header-announcement, .bd-header, .bd-sidebar-primary,
.bd-sidebar-secondary, .header-article, footer, .prev-next-area,
.tl-edition-switch { display: none !important; }
.bd-main .bd-content .bd-article-container { max-width: 100% !important; }
nav.tl-pdf-contents { break-after: page; }
nav.tl-pdf-contents ul ul { font-size: 0.9em; }
nav.tl-pdf-contents a { text-decoration: none; }
section.tl-pdf-page { break-before: page; }
h2, h3, h4 { break-after: avoid; break-inside: avoid; }
div.toctree-wrapper > p.caption { display: none !important; }
section.tl-pdf-page > h2 { font-size: 2.2em; }
div.cell_output img, div.cell_output svg { max-width: 100%; }
pre { white-space: pre-wrap; }
"""

FOOTER = (
    '<div style="font-size:8px;width:100%;text-align:center;color:#555">'
    '<span class="pageNumber"></span> / <span class="totalPages"></span>'
    "</div>"
)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def singlehtml(language: str) -> Path:
    """Build the edition as one page; return its folder."""
    config, toc = i18n.edition_files(language)
    out = OUT / f"{i18n.LANGUAGES.get(language, language)}-singlehtml"
    subprocess.run(
        [i18n._bin("jupyter-book"), "build", str(i18n.NOTEBOOKS),
         "--config", str(config), "--toc", str(toc),
         "--path-output", str(out), "--builder", "singlehtml",
         "-W", "--keep-going"],
        check=True,
    )  # fmt: skip
    return out / "_build" / "singlehtml"


def root_page() -> str:
    """The single page's file: the book's root (``index.html`` only
    redirects to it)."""
    toc = (i18n.NOTEBOOKS / "_toc.yml").read_text(encoding="utf-8")
    match = re.search(r"^root:\s*(\S+)", toc, re.M)
    if match is None:
        raise SystemExit("notebooks/_toc.yml has no root: line")
    return Path(match.group(1)).stem + ".html"


def print_pdf(site: Path, target: Path, contents_word: str) -> dict:
    """Print the edition's single page to ``target``; return what was
    drawn."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from conftest import CHROMIUM_FLAGS  # the browser tests' own flags

    executable = shutil.which("chromium")
    if executable is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/"
    outside: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=executable, headless=True,
                args=CHROMIUM_FLAGS,
            )  # fmt: skip
            page = browser.new_page()

            def only_local(route):
                if route.request.url.startswith(url):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            page.route("**/*", only_local)
            page.goto(url + root_page(), wait_until="load", timeout=WAIT_MS)
            page.set_default_timeout(WAIT_MS)
            drawn = page.evaluate(TYPESET)
            drawn["entries"] = page.evaluate(CONTENTS, contents_word)
            page.add_style_tag(content=PRINT_CSS)
            target.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(
                path=str(target), format="A4", print_background=True,
                outline=False, tagged=True, display_header_footer=True,
                header_template="<span></span>", footer_template=FOOTER,
                margin={"top": "18mm", "bottom": "20mm",
                        "left": "16mm", "right": "16mm"},
            )  # fmt: skip
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    drawn["outside"] = outside
    return drawn


def write_outline(target: Path, contents_word: str, entries: list) -> None:
    """Give ``target`` an outline of the book's pages and their sections,
    each entry at the page Chromium put its heading on (the contents'
    links name them: a named destination per id)."""
    from pypdf import PdfReader, PdfWriter

    reader = PdfReader(str(target))
    pages = {  # the names are PDF names: "/" + the element's id
        name.removeprefix("/"): reader.get_destination_page_number(dest)
        for name, dest in reader.named_destinations.items()
    }
    writer = PdfWriter(clone_from=reader)
    writer.add_outline_item(title=contents_word, page_number=0)
    missing = []
    for entry in entries:
        if entry["id"] not in pages:
            missing.append(entry["id"])
            continue
        parent = writer.add_outline_item(
            title=entry["title"], page_number=pages[entry["id"]]
        )
        for section in entry["sections"]:
            if section["id"] in pages:
                writer.add_outline_item(
                    title=section["title"],
                    page_number=pages[section["id"]],
                    parent=parent,
                )
            else:
                missing.append(section["id"])
    if missing:
        raise SystemExit(f"{target}: no destination for {missing[:5]}")
    writer.page_mode = "/UseOutlines"
    partial = target.with_suffix(".partial.pdf")
    with partial.open("wb") as out:
        writer.write(out)
    partial.replace(target)


def make(language: str) -> Path:
    name, contents_word = EDITIONS[language]
    start = time.perf_counter()
    site = singlehtml(language)
    built = time.perf_counter()
    target = OUT / name
    drawn = print_pdf(site, target, contents_word)
    printed = time.perf_counter()
    problems = []
    if drawn["outside"]:
        problems.append(f"requests outside the book: {drawn['outside'][:5]}")
    if drawn["errors"]:
        problems.append(f"{drawn['errors']} MathJax errors")
    if drawn["charts_left"]:
        problems.append(f"{drawn['charts_left']} charts not drawn")
    if problems:
        raise SystemExit(f"{target}: " + "; ".join(problems))
    from pypdf import PdfReader

    write_outline(target, contents_word, drawn["entries"])
    outlined = time.perf_counter()
    drawn["chapters"] = len(drawn["entries"])
    pages = len(PdfReader(str(target)).pages)
    summary = {
        "pages": pages, "bytes": target.stat().st_size,
        "chapters": drawn["chapters"], "formulas": drawn["math"],
        "math_errors": drawn["errors"], "charts_left": drawn["charts_left"],
        "outside_requests": drawn["outside"],
        "build_s": round(built - start, 1),
        "print_s": round(printed - built, 1),
        "outline_s": round(outlined - printed, 1),
    }  # fmt: skip
    target.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"{target}: {pages} pages, {target.stat().st_size / 2**20:.1f} MiB, "
          f"{drawn['chapters']} chapters in the contents, {drawn['math']} "
          f"formulas; built in {built - start:.0f} s, printed in "
          f"{printed - built:.0f} s")  # fmt: skip
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--language", choices=sorted(EDITIONS),
                        action="append",
                        help="an edition (default: both)")  # fmt: skip
    args = parser.parse_args(argv)
    languages = args.language or sorted(EDITIONS)
    if len(languages) == 1:
        make(languages[0])
        return 0
    # Each edition's build and print is one process on one core: on two
    # cores they run side by side.
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=min(len(languages), os.cpu_count() or 1),
        mp_context=context,
    ) as pool:
        for done in [pool.submit(make, language) for language in languages]:
            done.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
