"""The Chinese edition's message catalogues: extract, update, check.

The book has one source. Sphinx's gettext builder cuts every page into
messages (a paragraph, a heading, a list item, a table cell, a caption);
each edition other than English keeps a catalogue of translations per
page under ``notebooks/locales/<lang>/LC_MESSAGES/``. Code cells and
their outputs are not messages: both editions show the same ones.

::

    python tools/i18n.py pot       # the English messages -> _build/gettext
    python tools/i18n.py update    # merge them into the catalogues
    python tools/i18n.py check     # the per-page counts; fail on a defect
    python tools/i18n.py build     # the Chinese edition -> _build/html/zh

``update`` keeps every translation whose English is unchanged, marks the
translation of a changed message *fuzzy* (the page then shows the English
message until someone confirms or fixes it) and adds new messages empty.

``check`` reads every catalogue as untrusted input and fails on:

- a page marked complete in ``status.json`` with a fuzzy or untranslated
  message;
- a translation that begins ``1. `` (Markdown reads it as a numbered list
  and drops the heading; write ``1\\. ``);
- a translation that drops or changes what must pass through unchanged:
  a role or its target (``{cite:t}`key```, ``{ref}``, ``{eq}``), inline
  code, inline or display maths, a link's target, a footnote reference;
- a catalogue that does not parse, or a page with no catalogue.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
LOCALES = NOTEBOOKS / "locales"
BUILD = ROOT / "_build"
POT_DIR = BUILD / "gettext"
I18N_BUILD = BUILD / "i18n"
SYLLABUS = ROOT / "transformer_lite" / "classroom" / "syllabus.json"
LANGUAGES = {"zh_CN": "zh"}  # catalogue language -> the edition's folder
TITLES = {"zh_CN": "transformer-lite 中文版"}
# The table of contents' part captions (not messages: _toc.yml is not a
# page), each edition's own.
CAPTIONS = {
    "zh_CN": {"Chapters": "章节", "Reference": "参考资料", "Teaching": "教学"},
}
# Pages whose messages are not translated: the API reference is the
# package's docstrings, which stay English in every edition.
UNTRANSLATED_PAGES = {"api"}

# What a translation must carry over unchanged, as a multiset.
ROLE = re.compile(r"\{[a-z:]+\}`[^`]*`")
CODE = re.compile(r"(?<![}`])`[^`\n]+`(?!`)")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
FOOTNOTE = re.compile(r"\[\^[^\]]+\]")
NUMBERED_TITLE = re.compile(r"^\d+\.\s")
KINDS = {
    "role": ROLE,
    "inline code": CODE,
    "maths": MATH,
    "link target": LINK_TARGET,
    "footnote": FOOTNOTE,
}


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def book_config(language: str | None, execute: str | None) -> str:
    """``notebooks/_config.yml`` for another builder or edition, written
    so that it can live outside ``notebooks/`` (paths made absolute)."""
    text = (NOTEBOOKS / "_config.yml").read_text(encoding="utf-8")
    tools, bib = ROOT / "tools", NOTEBOOKS / "references.bib"
    text = text.replace("book_extension: ../tools", f"book_extension: {tools}")
    text = text.replace("[references.bib]", f"[{bib}]")
    if execute is not None:
        text = re.sub(r"execute_notebooks: \w+", f'execute_notebooks: "{execute}"',
                      text)  # fmt: skip
    extra = ["    gettext_location: false", "    gettext_uuid: false"]
    if language is not None:
        extra += [f"    language: {language}",
                  f"    locale_dirs: [{LOCALES}]"]  # fmt: skip
    marker = "    nb_execution_show_tb: true"
    if marker not in text:
        raise SystemExit(f"notebooks/_config.yml no longer has {marker!r}")
    return text.replace(marker, "\n".join(extra) + "\n" + marker)


def edition_files(language: str) -> tuple[Path, Path]:
    """Write the edition's book config and table of contents (``"en"``:
    the English ones, with the shared execution cache).

    The config is the English one with the language, the catalogues and
    the English build's execution cache (so no chapter runs again); the
    table of contents is the English one with its captions translated.
    """
    folder = I18N_BUILD / LANGUAGES.get(language, language)
    folder.mkdir(parents=True, exist_ok=True)
    text = book_config(None if language == "en" else language, None)
    title = TITLES.get(language, "transformer-lite")
    text, n = re.subn(r"^title: .*$", f"title: {title}", text, flags=re.M)
    cache = BUILD / ".jupyter_cache"
    text, m = re.subn(r"^execute:\n", f"execute:\n  cache: {cache}\n", text,
                      flags=re.M)  # fmt: skip
    if (n, m) != (1, 1):
        raise SystemExit("notebooks/_config.yml: expected one title and "
                         "one execute section")  # fmt: skip
    config = folder / "_config.yml"
    config.write_text(text, encoding="utf-8")
    toc = (NOTEBOOKS / "_toc.yml").read_text(encoding="utf-8")
    names = CAPTIONS.get(language, {})

    def caption(match: re.Match) -> str:
        english = match.group(2).strip()
        if language == "en":
            return match.group(0)
        if english not in names:
            raise SystemExit(
                f"_toc.yml caption {english!r} has no {language} name in "
                f"tools/i18n.py CAPTIONS: add one"
            )
        return f"{match.group(1)}{names[english]}"

    toc = re.sub(r"^(\s*-?\s*caption: )(.+)$", caption, toc, flags=re.M)
    toc_path = folder / "_toc.yml"
    toc_path.write_text(toc, encoding="utf-8")
    return config, toc_path


def build(language: str = "zh_CN") -> None:
    """Build one edition from the English build's executed chapters into
    ``_build/html/<folder>`` (strict: a warning fails it, as ``make book``)."""
    if not (BUILD / ".jupyter_cache").exists():
        raise SystemExit("no _build/.jupyter_cache: run `make book` first")
    config, toc = edition_files(language)
    out = BUILD / LANGUAGES[language]
    subprocess.run(
        [_bin("jupyter-book"), "build", str(NOTEBOOKS), "--config", str(config),
         "--toc", str(toc), "--path-output", str(out), "-W", "--keep-going"],
        check=True,
    )  # fmt: skip
    site = BUILD / "html" / LANGUAGES[language]
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(out / "_build" / "html", site)
    print(f"the {language} edition: {site}/index.html")


def pot() -> None:
    """Extract the English messages (no chapter runs: execution is off)."""
    I18N_BUILD.mkdir(parents=True, exist_ok=True)
    config = I18N_BUILD / "_config.gettext.yml"
    config.write_text(book_config(None, "off"), encoding="utf-8")
    out = I18N_BUILD / "gettext-build"
    subprocess.run(
        [_bin("jupyter-book"), "build", str(NOTEBOOKS), "--config", str(config),
         "--path-output", str(out), "--builder", "custom",
         "--custom-builder", "gettext", "-W", "--keep-going"],
        check=True,
    )  # fmt: skip
    POT_DIR.mkdir(parents=True, exist_ok=True)
    for path in (out / "_build" / "gettext").glob("*.pot"):
        (POT_DIR / path.name).write_bytes(path.read_bytes())
    syllabus_pot()


def syllabus_pot() -> None:
    """The chapters' objectives (the slides' first page, the teaching
    plan's) and prerequisites (the chapter's card) as one more catalogue,
    ``syllabus``: they are data in
    ``transformer_lite/classroom/syllabus.json``, not a page's text."""
    import polib

    data = json.loads(SYLLABUS.read_text(encoding="utf-8"))
    catalogue = polib.POFile()
    catalogue.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    for chapter in sorted(data):
        for objective in data[chapter]["objectives"]:
            if catalogue.find(objective) is None:
                catalogue.append(polib.POEntry(
                    msgid=objective, msgstr="",
                    comment=f"chapter {chapter}'s objectives"))  # fmt: skip
        maths = data[chapter]["maths"]
        if catalogue.find(maths) is None:
            catalogue.append(polib.POEntry(
                msgid=maths, msgstr="",
                comment=f"chapter {chapter}'s prerequisites"))  # fmt: skip
    catalogue.save(str(POT_DIR / "syllabus.pot"))


def update() -> None:
    """Merge the extracted messages into every language's catalogues."""
    if not any(POT_DIR.glob("*.pot")):
        raise SystemExit(f"no .pot files in {POT_DIR}: run `pot` first")
    for language in LANGUAGES:
        subprocess.run(
            [_bin("sphinx-intl"), "update", "-p", str(POT_DIR),
             "-l", language, "-d", str(LOCALES)],
            check=True,
        )  # fmt: skip
        for page in UNTRANSLATED_PAGES:
            (LOCALES / language / "LC_MESSAGES" / f"{page}.po").unlink(
                missing_ok=True
            )


def carried(text: str) -> collections.Counter:
    """What a message carries that its translation must keep, by kind."""
    found: collections.Counter = collections.Counter()
    without_roles = ROLE.sub(" ", text)
    for kind, pattern in KINDS.items():
        source = text if kind in ("role", "link target") else without_roles
        if kind == "inline code":
            source = MATH.sub(" ", source)
        for match in pattern.findall(source):
            found[(kind, match)] += 1
    return found


def entry_problems(msgid: str, msgstr: str) -> list[str]:
    """What is wrong with one translation ([] when nothing is)."""
    problems = []
    if NUMBERED_TITLE.match(msgstr):
        escaped = NUMBERED_TITLE.match(msgstr).group().replace(".", "\\.")
        problems.append(
            f"starts {msgstr[:4]!r}: Markdown reads a numbered list, "
            f"write '{escaped}'"
        )
    want, got = carried(msgid), carried(msgstr)
    for (kind, item), n in sorted((want - got).items()):
        problems.append(f"drops the {kind} {item!r}" + (f" ({n}x)" if n > 1 else ""))
    for (kind, item), n in sorted((got - want).items()):
        problems.append(f"adds the {kind} {item!r}, which the English lacks")
    return problems


def shown(path: Path) -> str:
    """A path as the messages print it: from the repository if inside."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def load_status(language: str) -> dict[str, str]:
    path = LOCALES / language / "status.json"
    if not path.exists():
        return {}
    status = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(status, dict) or not all(
        isinstance(k, str) and v in ("complete", "in progress")
        for k, v in status.items()
    ):
        raise SystemExit(
            f"{path}: expected an object of page -> 'complete' or "
            f"'in progress', got {status!r}"
        )
    return status


def check(pages: list[str] | None = None, quiet: bool = False) -> int:
    """Print the per-page counts; return the number of defects."""
    import polib  # the venv's: make test installs it

    defects = 0
    for language in LANGUAGES:
        folder = LOCALES / language / "LC_MESSAGES"
        status = load_status(language)
        for name in status:
            if not (folder / f"{name}.po").exists():
                print(f"{language}: {name} is marked {status[name]} "
                      f"but has no catalogue {folder / name}.po")  # fmt: skip
                defects += 1
        rows = []
        for path in sorted(folder.glob("*.po")):
            page = path.stem
            if pages and page not in pages:
                continue
            try:
                catalogue = polib.pofile(str(path))
            except (OSError, ValueError) as error:
                print(f"{shown(path)}: cannot be read as a catalogue: {error}")
                defects += 1
                continue
            live = [e for e in catalogue if not e.obsolete]
            fuzzy = [e for e in live if "fuzzy" in e.flags]
            empty = [e for e in live if not e.msgstr and "fuzzy" not in e.flags]
            done = len(live) - len(fuzzy) - len(empty)
            state = status.get(page, "not started" if done == 0 else "in progress")
            rows.append((page, done, len(fuzzy), len(empty), state))
            for entry in live:
                if not entry.msgstr or "fuzzy" in entry.flags:
                    continue
                for problem in entry_problems(entry.msgid, entry.msgstr):
                    print(f"{shown(path)}: {entry.msgid[:60]!r} "
                          f"{problem}")  # fmt: skip
                    defects += 1
            if state == "complete" and (fuzzy or empty):
                for entry in (fuzzy + empty)[:5]:
                    kind = "fuzzy" if entry in fuzzy else "untranslated"
                    print(f"{shown(path)}: {kind}: {entry.msgid[:70]!r}")
                print(f"{shown(path)}: marked complete, but "
                      f"{len(fuzzy)} fuzzy and {len(empty)} untranslated")  # fmt: skip
                defects += 1
        if not quiet:
            print(f"\n{language}: page, translated, fuzzy, untranslated, state")
            for page, done, nfuzzy, nempty, state in rows:
                print(f"  {page:34s} {done:5d} {nfuzzy:5d} {nempty:5d}  {state}")
            totals = [sum(r[i] for r in rows) for i in (1, 2, 3)]
            print(f"  {'all':34s} {totals[0]:5d} {totals[1]:5d} {totals[2]:5d}")
    print(f"{defects} defect(s)" if defects else "no defects")
    return defects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pot")
    sub.add_parser("update")
    sub.add_parser("build")
    checking = sub.add_parser("check")
    checking.add_argument("pages", nargs="*", help="only these pages")
    checking.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "pot":
        pot()
    elif args.command == "update":
        update()
    elif args.command == "build":
        build()
    elif args.command == "check":
        return 1 if check(args.pages, args.quiet) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
