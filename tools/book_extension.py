"""Sphinx extension for the transformer-lite book (named in _config.yml).

It does four things jupyter-book does not do on its own:

1. **Serve MathJax and the vega bundle from the site itself.** Both come
   from ``.cache/book_static`` (made by ``tools/book_assets.py``). They are
   added here, not through ``notebooks/_static``, because jupyter-book adds
   every ``.js`` file found under ``_static`` to every page, which would
   load all of MathJax's components at once. MathJax goes on pages with
   math (Sphinx decides), the vega bundle on pages with an altair chart.
2. **Offer each chapter as an executed notebook.** The chapter with the
   outputs of its cached execution is written beside its ``.py`` source in
   ``_sources``, and the page's download menu gets a ``.ipynb`` entry next
   to the ``.py`` one.
3. **Keep the site in step with the chapters.** Sphinx rereads only
   changed sources. Here a chapter whose execution failed runs again on
   the next build instead of passing unnoticed; a chapter added or removed
   refreshes every page's navigation; a removed chapter's page is deleted.
4. **The ``api-module`` directive** for the API page: a section named
   after a module, holding its docstrings (``automodule``). A module that
   is planned but not written yet is left out with a note in the build log;
   one that exists but fails to import still fails the build.
5. **Say which edition a page belongs to**, in a bar above the header,
   with a link to the same page in the other edition. The Chinese edition
   (``language: zh_CN``, ``tools/i18n.py``) lives in the English site's
   ``zh/`` folder, so the two links are ``zh/<page>.html`` and
   ``../<page>.html``.
6. **The chapter's card in the edition's language.** The card at the top
   of a chapter (objectives, prerequisites, times: ``chapter_card``) is a
   cell's output, shared with the English build; in another edition it is
   rebuilt from the syllabus and the edition's ``syllabus`` catalogue
   (an objective not yet translated stays English).
"""

import importlib.util
from pathlib import Path

import jupytext
import nbformat
from docutils import nodes
from jupyter_cache import get_cache
from myst_nb.sphinx_ import NbMetadataCollector
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.ext.autodoc.directive import AutodocDirective
from sphinx.util import logging

STATIC = Path(__file__).resolve().parent.parent / ".cache" / "book_static"
MATHJAX = "mathjax/tex-chtml.js"  # relative to _static
VEGA = "vega/vega-altair.js"

logger = logging.getLogger(__name__)


def use_local_assets(app: Sphinx, config) -> None:
    """Serve the assets from ``.cache/book_static`` and point MathJax there."""
    missing = [f for f in (MATHJAX, VEGA) if not (STATIC / f).is_file()]
    if missing:
        raise ExtensionError(
            f"{', '.join(missing)} missing in {STATIC}: run "
            "`.venv/bin/python tools/book_assets.py` (make book does)"
        )
    config.html_static_path.append(str(STATIC))
    config.mathjax_path = MATHJAX


def has_altair_chart(doctree: nodes.document | None) -> bool:
    """Whether the page holds an altair chart (its HTML calls vegaEmbed)."""
    if doctree is None:
        return False
    return any(
        "vegaEmbed" in node.astext() for node in doctree.findall(nodes.raw)
    )


def add_vega_bundle(app, pagename, templatename, context, doctree) -> None:
    """Load the vega bundle in the head of pages with an altair chart."""
    if has_altair_chart(doctree):
        app.add_js_file(VEGA)  # called here, it is for this page only


def offer_executed_notebook(
    app, pagename, templatename, context, doctree
) -> None:
    """Put the executed chapter in ``_sources`` and in the download menu.

    The outputs come from the execution cache (myst-nb's copy in
    ``_build/jupyter_execute`` has none in cache mode). sphinx-book-theme
    shows ``context["ipynb_source"]`` as a ``.ipynb`` download; it runs at
    priority 501, so this runs before.
    """
    source = Path(app.env.doc2path(pagename))
    if source.suffix != ".py":
        return
    notebook = jupytext.read(source, fmt="py:percent")
    cache = get_cache(app.env.mystnb_config.execution_cache_path)
    try:
        _, notebook = cache.merge_match_into_notebook(notebook)
    except KeyError:
        logger.warning("no executed notebook in the cache", location=pagename)
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


# The editions: Sphinx's language -> (this edition's name, the other's
# name, the link from a page to the same page in the other edition).
EDITIONS = {
    "en": ("English edition", "中文版", "zh/{page}.html"),
    "zh_CN": ("中文版", "English edition", "../{page}.html"),
}


def add_edition_switch(app, pagename, templatename, context, doctree) -> None:
    """The bar that names the edition and links to the other one."""
    language = app.config.language or "en"
    if language not in EDITIONS:
        raise ExtensionError(
            f"no edition for language {language!r}: expected one of "
            f"{sorted(EDITIONS)}"
        )
    this, other, link = EDITIONS[language]
    href = link.format(page=pagename)
    context["theme_announcement"] = (
        f'<span class="tl-edition" lang="{language.replace("_", "-")}">'
        f'{this}</span> · <a class="tl-edition-switch" href="{href}">'
        f"{other}</a>"
    )


# The card's own words, per edition (the objectives and prerequisites come
# from the catalogue ``syllabus.po``).
CARD_WORDS = {
    "zh_CN": {
        "after": "学完本章，你将能够：",
        "before": "先修：",
        "none": "无需先读其他章节",
        "chapters": "第 {} 章",
        "join": "、",
        "time": "时间：",
        "times": "阅读约 {minutes} 分钟；"
        "在一个 CPU 核上运行约 {run}（实测）。",
        "seconds": "{} 秒",
        "minutes": "{:.1f} 分钟",
        "end": "。",
        "semicolon": "；",
    },
}
CARD_HEADING = "After this chapter you can:"  # chapter_card's first line


def card_nodes(number: int, language: str, catalogue: dict) -> list:
    """The card of chapter ``number`` as docutils nodes, in ``language``;
    ``catalogue`` maps an English objective or prerequisite to its
    translation."""
    from transformer_lite.classroom import syllabus

    words = CARD_WORDS[language]
    entry = syllabus()[number]

    def tr(text: str) -> str:
        return catalogue.get(" ".join(text.split()), text)

    def lead(strong: str, rest: str) -> nodes.paragraph:
        return nodes.paragraph("", "", nodes.strong(text=strong),
                               nodes.Text(rest))  # fmt: skip

    goals = nodes.bullet_list(classes=["simple"])
    for goal in entry.objectives:
        goals += nodes.list_item("", nodes.paragraph(text=tr(goal)))
    chapters = (
        words["chapters"].format(
            words["join"].join(str(c) for c in entry.chapters)
        )
        if entry.chapters
        else words["none"]
    )
    s = entry.running_seconds
    run = words["seconds"].format(s) if s < 120 else words["minutes"].format(
        s / 60
    )
    times = words["times"].format(minutes=entry.reading_minutes, run=run)
    return [
        nodes.paragraph("", "", nodes.strong(text=words["after"])),
        goals,
        lead(words["before"],
             chapters + words["semicolon"] + tr(entry.maths) + words["end"]),
        lead(words["time"], times),
    ]  # fmt: skip


def syllabus_catalogue(app: Sphinx) -> dict:
    """English -> translation from the edition's ``syllabus.po`` (fuzzy
    and untranslated entries left out)."""
    import polib

    for folder in app.config.locale_dirs:
        path = (Path(app.confdir) / folder / app.config.language /
                "LC_MESSAGES" / "syllabus.po")  # fmt: skip
        if path.exists():
            return {
                " ".join(e.msgid.split()): e.msgstr
                for e in polib.pofile(str(path))
                if e.msgstr and not e.obsolete and "fuzzy" not in e.flags
            }
    return {}


def cards(node, page: str):
    """Each chapter card under ``node``, with the page it belongs to. In
    the single-page build every page is inlined in the root's doctree
    inside a ``start_of_file`` marker naming it (whose children do not
    know their parent, so the walk carries the page down)."""
    from sphinx import addnodes

    if isinstance(node, addnodes.start_of_file):
        page = node["docname"]
    if isinstance(node, nodes.container) and "cell_output" in node["classes"]:
        strong = next(iter(node.findall(nodes.strong)), None)
        if strong is not None and strong.astext() == CARD_HEADING:
            yield node, page
            return
    for child in node.children:
        if isinstance(child, nodes.Element):
            yield from cards(child, page)


def translate_card(app: Sphinx, doctree, docname: str) -> None:
    """Replace each English chapter card by the edition's."""
    from transformer_lite.classroom import syllabus

    language = app.config.language or "en"
    if language not in CARD_WORDS:
        return
    catalogue = None
    for container, page in list(cards(doctree, docname)):
        number = page.rsplit("/", 1)[-1][:2]
        if not number.isdigit() or int(number) not in syllabus():
            continue
        if catalogue is None:
            catalogue = syllabus_catalogue(app)
        container.children = []
        container += card_nodes(int(number), language, catalogue)


def docs_to_reread(app, env, added, changed, removed) -> list[str]:
    """Documents to read again besides those whose source changed.

    A document added or removed changes every page's navigation (and what
    the glob in _toc.yml matches): then all of them. A chapter whose last
    execution failed: that one, so that it runs again. Reading a chapter
    whose execution is cached does not run it.
    """
    if added or removed:
        return sorted(env.found_docs)
    failed = []
    for docname in env.all_docs:
        result = NbMetadataCollector.get_exec_data(env, docname) or {}
        if result.get("succeeded") is False:
            failed.append(docname)
    return failed


def delete_removed_pages(app, env, added, changed, removed) -> list[str]:
    """Delete the page and sources of each removed document from the site."""
    out = Path(app.outdir)
    for docname in removed:
        (out / f"{docname}.html").unlink(missing_ok=True)
        for source in (out / "_sources").glob(f"{docname}.*"):
            source.unlink()
    return []


def module_exists(name: str) -> bool:
    """False only when the module's file is not there (not written yet)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # its package fails to import: autodoc tells why
        return True


class ApiModule(AutodocDirective):
    """``api-module``: one module's docstrings, under its name."""

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0].strip()
        if not module_exists(name):
            logger.info(f"[api-module] {name} does not exist yet: left out")
            return []
        self.name = "automodule"  # AutodocDirective dispatches on the name
        section = nodes.section(ids=[nodes.make_id(name)], names=[name])
        section += nodes.title("", "", nodes.literal(text=name))
        self.state.document.note_implicit_target(section, section)
        section += super().run()
        return [section]


def setup(app: Sphinx) -> dict:
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("config-inited", use_local_assets)
    app.connect("html-page-context", add_vega_bundle)
    app.connect("html-page-context", add_edition_switch)
    app.connect("doctree-resolved", translate_card)
    app.connect("html-page-context", offer_executed_notebook, priority=400)
    app.connect("env-get-outdated", docs_to_reread)
    app.connect("env-get-outdated", delete_removed_pages)
    app.add_directive("api-module", ApiModule)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
