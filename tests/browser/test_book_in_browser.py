"""The built book works in a real browser, offline (``make browser-test``).

Every page of ``_build/html`` is opened in headless Chromium with every
request outside the local server blocked. Each page must make no such
request, log no console error, typeset all its math, draw all its altair
charts and load all its images; a full-page screenshot of each lands in
``_build/screenshots/`` for review. Each chapter must also hide its
``remove-cell`` / ``remove-input`` code, link to its neighbours in reading
order, offer its ``.py`` and executed ``.ipynb`` for download, and be found
by the search page. The classroom edition's pages work too: the graded
exercises' solutions are folded until clicked, the teaching page links
every chapter's slides, and every deck starts reveal.js and steps through
its slides. The Chinese edition (``_build/html/zh``) passes the same page
checks; every page of each edition links to the same page of the other,
its search finds a chapter by a Chinese word, its decks start, and the
browser has a font that draws Chinese (not boxes).

Chromium is Debian's (``apt-get install chromium``), driven by the
``playwright`` package; ``playwright install`` is never needed.
"""

import functools
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jupytext
import pytest
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from .conftest import WAIT_MS  # for pages, MathJax and vega to finish

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
READING_ORDER = [*CHAPTERS, "api", "glossary", "bibliography", "teaching"]
DECKS = [c for c in CHAPTERS if not c.startswith("00")]  # make slides
ZH = "zh"  # the Chinese edition's folder (make book-zh)
HIDDEN_TAGS = {"remove-cell", "remove-input"}


# Fixtures: the book served on 127.0.0.1, and headless Chromium.


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without logging each request to stderr."""

    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="session")
def book_url() -> str:
    """The root URL of ``_build/html``, served on 127.0.0.1."""
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no book in {HTML}: run `make book` first")
    if "PYTEST_XDIST_WORKER" not in os.environ:  # workers: make clears
        shutil.rmtree(SCREENSHOTS, ignore_errors=True)  # none from before
    handler = functools.partial(QuietHandler, directory=str(HTML))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@dataclass
class Visit:
    """An open page and what went wrong while it loaded and ran."""

    page: Page
    outside: list[str] = field(default_factory=list)  # blocked requests
    errors: list[str] = field(default_factory=list)  # console, exceptions
    missing: list[str] = field(default_factory=list)  # local 4xx/5xx


@pytest.fixture
def visit(browser_context, book_url):
    """``visit("page.html")`` opens a page of the book in a new tab.

    Every request to anything but the local site is blocked and recorded,
    web sockets included; so are console errors, uncaught exceptions and
    files the local site does not have. ``visit(path, typeset=False)``
    also skips MathJax and the chart library, for the checks that read
    only the page's structure: typesetting a chapter's maths costs more
    than loading it.
    """
    pages = []

    def open_page(path: str, *, typeset: bool = True) -> Visit:
        page = browser_context.new_page()
        pages.append(page)
        visit = Visit(page)

        def only_local(route):
            url = route.request.url
            if not typeset and any(lib in url for lib in TYPESETTERS):
                route.abort()
            elif url.startswith(book_url):
                route.continue_()
            else:
                visit.outside.append(url)
                route.abort()

        def no_web_socket(ws):
            visit.outside.append(ws.url)
            ws.close()

        def on_console(message):
            if message.type == "error":
                visit.errors.append(message.text)

        def on_response(response):
            if response.status >= 400:
                visit.missing.append(f"{response.status} {response.url}")

        page.route("**/*", only_local)
        page.route_web_socket("**/*", no_web_socket)
        page.on("console", on_console)
        page.on("pageerror", lambda error: visit.errors.append(str(error)))
        page.on("response", on_response)
        page.goto(book_url + path, wait_until="load")
        return visit

    yield open_page
    for page in pages:
        page.close()


# The checks.


def book_pages() -> list[str]:
    """Every HTML page of the built book, relative to its root (the
    slides have checks of their own: test_slides_start_and_step)."""
    assets = {"_static", "_sources", "_images", "slides"}
    return sorted(
        path.relative_to(HTML).as_posix()
        for path in HTML.rglob("*.html")
        if not assets & set(path.relative_to(HTML).parts)
    )


# JavaScript run in the page. Each returns what is still wrong, or null.
MATH_PENDING = """() => {
  const math = [...document.querySelectorAll(".math")];
  const left = math.filter(e => !e.querySelector("mjx-container"));
  return left.length ? left.map(e => e.textContent.slice(0, 60)) : null;
}"""
MATH_ERRORS = """() => [
  ...document.querySelectorAll("mjx-merror")
].map(e => e.textContent)"""
CHARTS_PENDING = """() => {
  const charts = [...document.querySelectorAll('div[id^="altair-viz-"]')];
  const left = charts.filter(c => !c.querySelector("svg, canvas"));
  return left.length ? left.map(c => c.id + ": " + c.textContent) : null;
}"""
IMAGES_PENDING = """async () => {
  const images = [...document.images];
  images.forEach(i => { i.loading = "eager"; });
  await Promise.all(images.map(i => i.decode().catch(() => null)));
  const left = images.filter(i => !(i.complete && i.naturalWidth > 0));
  return left.length ? left.map(i => i.getAttribute("src")) : null;
}"""


SEARCH_FINISHED = """() => {
  const summary = document.querySelector("#search-results .search-summary");
  // Sphinx's own words, in each edition's language
  const done = /finished|did not match|搜索完成|没有匹配/;
  return summary && done.test(summary.innerText);
}"""


TYPESETTERS = ("/_static/mathjax/", "/_static/vega/")


def still_wrong(page, script: str):
    """What ``script`` reports once it reports nothing, or after WAIT_MS."""
    try:
        page.wait_for_function(f"() => ({script})() === null", timeout=WAIT_MS)
    except PlaywrightTimeout:
        pass  # report what is left
    return page.evaluate(script)


def test_book_is_built():
    pages = book_pages()
    for name in [*READING_ORDER, "index", "search"]:
        assert f"{name}.html" in pages, f"{name}.html missing: make book"
        assert f"{ZH}/{name}.html" in pages, (
            f"{ZH}/{name}.html missing: make book-zh"
        )


@pytest.mark.parametrize("path", book_pages())
def test_page_works_offline(visit, path):
    visit = visit(path)
    page = visit.page
    page.wait_for_load_state("networkidle")
    math_left = still_wrong(page, MATH_PENDING)
    charts_left = still_wrong(page, CHARTS_PENDING)
    images_left = page.evaluate(IMAGES_PENDING)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / (path.removesuffix(".html").replace("/", "__"))
    page.screenshot(path=f"{shot}.png", full_page=True)

    problems = {
        "requests outside the book": visit.outside,
        "console errors": visit.errors,
        "files not found": visit.missing,
        "math not typeset": math_left,
        "MathJax errors": page.evaluate(MATH_ERRORS),
        "charts not drawn": charts_left,
        "images not loaded": images_left,
    }
    problems = {what: found for what, found in problems.items() if found}
    assert not problems, f"{path}: {json.dumps(problems, indent=1)}"


def test_landing_page_is_the_preface(visit, book_url):
    page = visit("").page
    page.wait_for_url(f"{book_url}{CHAPTERS[0]}.html")


def hidden_code(chapter: str) -> list[str]:
    """The code of each cell the book must not show, from the source."""
    notebook = jupytext.read(NOTEBOOKS / f"{chapter}.py")
    return [
        cell.source.strip()
        for cell in notebook.cells
        if cell.cell_type == "code"
        and HIDDEN_TAGS & set(cell.metadata.get("tags", []))
    ]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_hides_hidden_cells(visit, chapter):
    page = visit(f"{chapter}.html", typeset=False).page
    shown = {
        code.strip()
        for code in page.locator(".cell_input pre").all_inner_texts()
    }
    for code in hidden_code(chapter):
        assert code not in shown, f"a hidden cell is shown: {code!r}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_links_to_its_neighbours(visit, book_url, chapter):
    """Previous/next point to the neighbours in reading order, and
    following "next", then "previous" there, comes back here."""
    page = visit(f"{chapter}.html", typeset=False).page
    where = READING_ORDER.index(chapter)
    before = READING_ORDER[where - 1] if where > 0 else None
    after = READING_ORDER[where + 1]
    prev_link = page.locator("a.left-prev")
    next_link = page.locator("a.right-next")
    if before is None:  # the landing page
        assert prev_link.count() == 0
    else:
        assert prev_link.get_attribute("href") == f"{before}.html"
    assert next_link.get_attribute("href") == f"{after}.html"

    with page.expect_navigation():
        next_link.click()
    assert page.url == f"{book_url}{after}.html"
    with page.expect_navigation():
        page.locator("a.left-prev").click()
    assert page.url == f"{book_url}{chapter}.html"
    assert page.locator("article h1").count() == 1


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_downloads(visit, book_url, chapter):
    page = visit(f"{chapter}.html", typeset=False).page
    for suffix in (".py", ".ipynb"):
        link = page.locator(f'a[href$="_sources/{chapter}{suffix}"]')
        assert link.count() == 1, f"no {suffix} in the download menu"
        response = page.request.get(book_url + link.get_attribute("href"))
        assert response.status == 200, f"{suffix} download: {response.status}"
    notebook = json.loads(response.body())
    outputs = [
        output
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
        for output in cell["outputs"]
    ]
    assert outputs, "the .ipynb download has no outputs"


def title_word(chapter: str) -> str:
    """The longest word of the chapter's title, to search for."""
    notebook = jupytext.read(NOTEBOOKS / f"{chapter}.py")
    for cell in notebook.cells:
        title = re.search(r"^# (.+)$", cell.source, re.M)
        if cell.cell_type == "markdown" and title:
            return max(re.findall(r"[A-Za-z]+", title.group(1)), key=len)
    raise AssertionError(f"{chapter} has no title")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_search_finds_chapter(visit, book_url, chapter):
    word = title_word(chapter)
    page = visit(f"search.html?q={word}").page
    # Sphinx lists the results a few at a time; the summary line says
    # when the last one is in.
    page.wait_for_function(SEARCH_FINISHED, timeout=WAIT_MS)
    results = page.locator("#search-results ul.search li a")
    pages = [
        results.nth(i).get_attribute("href").split("?")[0].split("#")[0]
        for i in range(results.count())
    ]
    assert f"{chapter}.html" in pages, f"{word!r} did not find {chapter}"


def bib_titles() -> dict[str, str]:
    """Each entry of references.bib: key -> title, as plain words."""
    text = (NOTEBOOKS / "references.bib").read_text()
    entries = re.findall(r"^@\w+\{([^,]+),(.*?)^\}", text, re.M | re.S)
    titles = {}
    for key, body in entries:
        title = re.search(r"title\s*=\s*\{\{(.*?)\}\}", body, re.S)
        assert title, f"references.bib: {key} has no double-braced title"
        titles[key] = " ".join(title.group(1).split())
    return titles


def cited_keys() -> set[str]:
    """Every key a page of the book cites with {cite:p} or {cite:t}."""
    pages = [*NOTEBOOKS.glob("[0-9][0-9]_*.py"), *NOTEBOOKS.glob("*.md")]
    roles = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
    return {
        key.strip()
        for page in pages
        for keys in roles.findall(
            re.sub(r"<!--.*?-->", "", page.read_text(), flags=re.S)
        )
        for key in keys.split(",")
    }


def words(text: str) -> str:
    """Lower-case letters and digits only: TeX accents, dashes and the
    bibliography style's capitals do not decide a match."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def test_reference_pages(visit):
    bibliography = visit("bibliography.html").page.locator("article")
    text = words(bibliography.inner_text())
    titles = bib_titles()
    cited = cited_keys()
    assert {"vaswani2017attention", "rush2018annotated"} <= cited
    missing = {
        key
        for key in cited
        if words(re.sub(r"\\.|[{}]", "", titles[key])) not in text
    }
    assert not missing, f"cited but not on the bibliography page: {missing}"
    entries = bibliography.locator(".citation, dl.citation > dt")
    assert entries.count() >= len(cited), (
        f"{entries.count()} entries rendered for {len(cited)} cited works"
    )
    api = visit("api.html").page
    assert api.locator("dl.py.function, dl.py.class").count() > 0


@pytest.mark.parametrize("chapter", DECKS)
def test_solutions_are_folded_until_clicked(visit, chapter):
    """The graded exercises' reference solutions (``hide-input``) are in
    the page but closed; a click opens one."""
    page = visit(f"{chapter}.html", typeset=False).page
    folds = page.locator("details.hide.above-input").filter(
        has=page.locator("pre", has_text="BEGIN SOLUTION")
    )
    assert folds.count() >= 5, f"{folds.count()} folded solutions"
    first = folds.first
    code = first.locator("pre", has_text="BEGIN SOLUTION")
    assert not code.is_visible(), "a solution is shown before a click"
    first.locator("summary").click()
    code.wait_for(state="visible", timeout=WAIT_MS)
    if chapter == DECKS[0]:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        first.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "solution-opened.png"))


def test_teaching_page_links_every_deck(visit, book_url):
    page = visit("teaching.html", typeset=False).page
    links = page.locator("ul.slide-decks a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs == [f"slides/{deck}.html" for deck in DECKS]
    with page.expect_navigation():
        links.first.click()
    page.wait_for_function("window.Reveal && Reveal.isReady()")


@pytest.mark.parametrize("edition", ["", f"{ZH}/"])
@pytest.mark.parametrize("deck", DECKS)
def test_slides_start_and_step(visit, deck, edition):
    """reveal.js starts, the deck has its title, sections and summary,
    and stepping to the last slide typesets its maths, offline."""
    visit = visit(f"{edition}slides/{deck}.html")
    page = visit.page
    page.wait_for_function("window.Reveal && Reveal.isReady()",
                           timeout=WAIT_MS)  # fmt: skip
    total = page.evaluate("Reveal.getTotalSlides()")
    assert total >= 5, f"{deck}: {total} slides"
    assert page.locator("section.summary").count() == 1
    figures = page.locator(".figure img, .figure svg").count()
    if deck == DECKS[0]:  # chapter 1 draws three matplotlib figures
        assert figures >= 3, f"{deck}: {figures} figures"
    page.evaluate("Reveal.slide(2)")
    math_left = still_wrong(page, MATH_PENDING)
    if deck == DECKS[0]:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(1500)  # the slide's transition ends
        name = f"slide-{edition.strip('/') or 'en'}-01-2.png"
        page.screenshot(path=str(SCREENSHOTS / name))
    page.evaluate("Reveal.slide(Reveal.getHorizontalSlides().length - 1)")
    assert page.evaluate("Reveal.isLastSlide()")
    problems = {
        "requests outside the book": visit.outside,
        "console errors": visit.errors,
        "files not found": visit.missing,
        "math not typeset": math_left,
    }
    problems = {what: found for what, found in problems.items() if found}
    assert not problems, f"{deck}: {json.dumps(problems, indent=1)}"


# The Chinese edition.


def test_editions_link_to_each_other(visit, book_url):
    """Each page names its edition and links to the same page in the
    other; following both links comes back."""
    for name in ("01_attention", "teaching", "glossary"):
        page = visit(f"{name}.html", typeset=False).page
        assert page.locator(".tl-edition").inner_text() == "English edition"
        switch = page.locator("a.tl-edition-switch")
        assert switch.get_attribute("href") == f"{ZH}/{name}.html"
        with page.expect_navigation():
            switch.click()
        assert page.url == f"{book_url}{ZH}/{name}.html"
        assert page.locator("html").get_attribute("lang") == "zh-CN"
        assert page.locator(".tl-edition").inner_text() == "中文版"
        with page.expect_navigation():
            page.locator("a.tl-edition-switch").click()
        assert page.url == f"{book_url}{name}.html"


def has_chinese(text: str) -> bool:
    return re.search(r"[\u4e00-\u9fff]", text) is not None


def test_chinese_pages_read_chinese(visit):
    """A translated chapter's title and prose are Chinese, its code is
    the English build's."""
    page = visit(f"{ZH}/01_attention.html", typeset=False).page
    title = page.locator("article h1").inner_text()
    assert has_chinese(title), f"the title is not translated: {title!r}"
    prose = page.locator("article p").all_inner_texts()
    share = sum(map(has_chinese, prose)) / max(len(prose), 1)
    assert share > 0.5, f"{share:.0%} of chapter 1's paragraphs are Chinese"
    card = page.locator(".cell_output strong").first.inner_text()
    assert card == "学完本章，你将能够：", f"the chapter's card reads {card!r}"
    english = visit("01_attention.html", typeset=False).page
    code = english.locator(".cell_input pre").all_inner_texts()
    assert page.locator(".cell_input pre").all_inner_texts() == code


def test_chinese_search_finds_attention(visit):
    """Sphinx's Chinese search (jieba's words) finds chapter 1 by 注意力."""
    page = visit(f"{ZH}/search.html?q=注意力").page
    page.wait_for_function(SEARCH_FINISHED, timeout=WAIT_MS)
    results = page.locator("#search-results ul.search li a")
    pages = [
        results.nth(i).get_attribute("href").split("?")[0].split("#")[0]
        for i in range(results.count())
    ]
    assert "01_attention.html" in pages, f"注意力 found only {pages}"


DRAWN_ALIKE = """() => {
  // Two different characters drawn alike are the boxes of a missing font.
  const draw = (text) => {
    const canvas = document.createElement("canvas");
    canvas.width = 64; canvas.height = 64;
    const context = canvas.getContext("2d");
    context.font = "48px sans-serif";
    context.fillText(text, 4, 52);
    return Array.from(context.getImageData(0, 0, 64, 64).data).join();
  };
  return draw("注") === draw("意");
}"""


def test_browser_draws_chinese(visit):
    page = visit(f"{ZH}/01_attention.html", typeset=False).page
    assert not page.evaluate(DRAWN_ALIKE), (
        "Chinese characters are drawn as boxes: no CJK font (make fonts)"
    )


def test_chinese_teaching_page_links_chinese_decks(visit, book_url):
    page = visit(f"{ZH}/teaching.html", typeset=False).page
    links = page.locator("ul.slide-decks a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs == [f"slides/{deck}.html" for deck in DECKS]
    with page.expect_navigation():
        links.first.click()
    assert page.url == f"{book_url}{ZH}/slides/{DECKS[0]}.html"
    page.wait_for_function("window.Reveal && Reveal.isReady()")
    title = page.locator("section h1").first.inner_text()
    assert has_chinese(title), f"the deck's title is English: {title!r}"
