"""Every chapter source is a clean jupytext percent file.

The chapters themselves are executed by nbval (``make nbval``); this checks
their form: the pairing header, no stray metadata, the 79-column rule.
"""

import re
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
ALLOWED_TAGS = {
    "remove-cell",
    "remove-input",
    "remove-output",
    "remove-stderr",
    "hide-input",
    "hide-output",
    "raises-exception",
    # the graded exercises' roles (tools/assignments.py)
    "exercise-setup",
    "solution",
    "check",
    "planted",
    "cheat",
    "prediction",
    "written",
    *(f"points-{n}" for n in range(1, 6)),
}


def test_there_are_chapters():
    assert CHAPTERS, f"no chapters found in {NOTEBOOKS}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_pairing_header(path):
    text = path.read_text()
    header = text.split("# ---", 2)
    assert text.startswith("# ---\n") and len(header) == 3, (
        f"{path.name} must start with a jupytext YAML header"
    )
    assert "formats: ipynb,py:percent" in header[1], (
        f"{path.name}: the header must pair it with an .ipynb"
    )
    assert "kernelspec:" in header[1] and "name: python3" in header[1]
    notebook = jupytext.reads(text, fmt="py:percent")
    assert set(notebook.metadata) <= {"jupytext", "kernelspec"}, (
        f"{path.name}: stray notebook metadata {set(notebook.metadata)}"
    )


@pytest.mark.parametrize(
    "path", [*CHAPTERS, NOTEBOOKS / "teaching.py"], ids=lambda p: p.name
)
def test_saving_in_jupyterlab_leaves_the_header_as_it_is(path):
    """JupyterLab writes the running kernel's spec into the notebook it
    saves: the tracked one is that spec, so opening and saving a chapter
    makes no diff."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    notebook = jupytext.read(path)
    assert notebook.metadata["kernelspec"] == {
        "name": "python3",
        "display_name": spec.display_name,
        "language": spec.language,
    }


CELL_MARKER = re.compile(r"^# %%(?P<rest>.*)$")
CELL_HEADER = re.compile(
    r"^( \[(markdown|raw)\])?( tags=\[(?P<tags>[^\]]*)\])?$"
)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_cells_carry_no_metadata_but_tags(path):
    """Cell markers are `# %%`, `# %% [markdown]`, optionally tags only."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        marker = CELL_MARKER.match(line)
        if not marker:
            continue
        header = CELL_HEADER.match(marker["rest"])
        assert header, f"{path.name}:{number}: cell metadata in {line!r}"
        tags = re.findall(r'"([^"]*)"', header["tags"] or "")
        unknown = set(tags) - ALLOWED_TAGS
        assert not unknown, f"{path.name}:{number}: unknown tags {unknown}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_opens_with_one_title(path):
    notebook = jupytext.reads(path.read_text(), fmt="py:percent")
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), (
        f"{path.name}: the first cell must be the chapter's '# Title'"
    )
    titles = [
        c
        for c in notebook.cells
        if c.cell_type == "markdown" and re.search(r"^# ", c.source, re.M)
    ]
    assert len(titles) == 1, f"{path.name}: more than one '# ' heading"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_lines_fit_the_page(path):
    long = [
        (n, len(line))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > 79
    ]
    assert not long, f"{path.name}: lines over 79 columns: {long[:5]}"


def test_api_page_lists_every_public_module():
    """The book's API reference (notebooks/api.md) names every module and
    subpackage of the package, and nothing else."""
    package = NOTEBOOKS.parent / "transformer_lite"
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.add(".".join(parts))
    api = (NOTEBOOKS / "api.md").read_text()
    listed = set(re.findall(r"api-module:: ([\w.]+)", api))
    assert modules - listed == set(), "modules missing from api.md"
    assert listed - modules == set(), "api.md names modules that do not exist"


@pytest.mark.parametrize(
    "path",
    [p for p in CHAPTERS if not p.name.startswith("00_")],
    ids=lambda p: p.name,
)
def test_preface_links_every_chapter(path):
    preface = jupytext.read(NOTEBOOKS / "00_preface.py")
    text = "\n".join(
        c.source for c in preface.cells if c.cell_type == "markdown"
    )
    assert f"]({path.stem})" in text, (
        f"the preface's list of chapters has no link to {path.stem}: add "
        f"an entry `N. **[Title]({path.stem})**: ...` under 'The chapters'"
    )


# A work cited in prose, "Shaw et al. (2018)" or "(Rush, 2018)", outside a
# {cite} role. Years from 1900 on; "Table 3" and section numbers do not
# match, since a name must come first.
AUTHOR_YEAR = re.compile(
    r"\b[A-Z][^\W\d_]+(?: et al\.| and [A-Z][^\W\d_]+)?,? \(?(?:19|20)\d\d\b"
)
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
BIBLIOGRAPHY = NOTEBOOKS / "references.bib"


def markdown_of(path):
    """The prose of one book page: a chapter's markdown cells, or an .md."""
    if path.suffix == ".md":
        return path.read_text()
    notebook = jupytext.read(path)
    return "\n".join(
        c.source for c in notebook.cells if c.cell_type == "markdown"
    )


def bib_keys():
    return set(re.findall(r"^@\w+\{([^,]+),", BIBLIOGRAPHY.read_text(), re.M))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_prose_cites_with_the_cite_role(path):
    """Every work a chapter names by author and year is a {cite}, so the
    bibliography lists it; each cited key is in references.bib."""
    prose = CITE.sub("", markdown_of(path)).replace("\n# ", " ")
    prose = re.sub(r"\s+", " ", prose)
    bare = AUTHOR_YEAR.findall(prose)
    assert not bare, (
        f"{path.name}: cited by hand, not with {{cite:p}}/{{cite:t}}: {bare}"
    )
    cited = {
        key.strip()
        for keys in CITE.findall(markdown_of(path))
        for key in keys.split(",")
    }
    unknown = cited - bib_keys()
    assert not unknown, f"{path.name}: keys not in references.bib: {unknown}"


def test_every_bibliography_entry_is_cited():
    """references.bib holds only works the book cites: the bibliography
    page lists cited works only, so an uncited entry would be lost."""
    pages = [*CHAPTERS, *NOTEBOOKS.glob("*.md")]
    cited = {
        key.strip()
        for page in pages
        for keys in CITE.findall(markdown_of(page))
        for key in keys.split(",")
    }
    assert bib_keys() - cited == set(), "entries no page cites"


def test_author_year_pattern_catches_hand_citations():
    """The pattern above finds the forms it must and spares the others."""
    for text in (
        "Shaw et al. (2018)",
        "(Rush, 2018)",
        "(Press and Wolf, 2017)",
        "Vaswani et al., 2017",
        "(Popović, 2015)",
    ):
        assert AUTHOR_YEAR.search(text), text
    for text in ("Table 3", "section 3.2.2", "in 2017 the paper", "L = 2048"):
        assert not AUTHOR_YEAR.search(text), text


@pytest.mark.parametrize(
    "path", CHAPTERS + sorted(NOTEBOOKS.glob("*.md")), ids=lambda p: p.name
)
def test_no_prose_line_starts_with_a_percent_sign(path):
    """MyST reads a line that starts with ``%`` as a comment and drops it
    from the page: chapter 13's "in\\n%):" lost its unit that way."""
    dropped = [
        line for line in markdown_of(path).splitlines() if line.startswith("%")
    ]
    assert not dropped, f"{path.name}: lines MyST drops as comments: {dropped}"
