"""The classroom on laptops, tried as the teaching page writes it: the
student kit (``make student-kit``) opened in JupyterLab, in headless
Chromium, with nothing reachable but the local server.

A student opens chapter 2's assignment, runs the cells from the top with
Shift+Enter, and the first check says in a line or two that exercise 2.1
is not done yet; the locked check cannot be edited. A reader who opens a
chapter's ``.py`` in JupyterLab as ``make lab`` starts it gets a notebook,
not a text file; and one who opens a chapter and saves it changes
nothing in its tracked source.
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jupytext
import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import assignments  # noqa: E402 - tools/ is not a package

CHAPTER = "02"  # its checks refuse the package's masks (exercise 2.1 on)
CURRENT = "window.jupyterapp.shell.currentWidget"
KERNEL_READY = f"""() => {{
  if (!window.jupyterapp) return false;
  const panel = {CURRENT};
  const kernel = panel && panel.sessionContext.session
    && panel.sessionContext.session.kernel;
  return !!kernel && !!panel.content && kernel.status === "idle"
    && kernel.connectionStatus === "connected";
}}"""


def cell_json(page, index: int) -> dict:
    return page.evaluate(
        f"() => {CURRENT}.content.model.cells.get({index}).toJSON()"
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a folder holding the student kit and a copy of the
    book's preface (with its paired notebook), with the settings ``make
    lab`` gives it (``jupyter/``): ``(url, token, folder)``."""
    root = tmp_path_factory.mktemp("lab")
    course = root.parent / f"{root.name}-course"
    assignments.build(assignments.chapters([CHAPTER]), course)
    assignments.kit(course, root / "kit")
    book = root / "book"
    book.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_preface.py", book)
    shutil.copy(ROOT / "jupytext.toml", root)  # as make lab finds it
    subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--to",
                    "ipynb", str(book / "00_preface.py")],
                   check=True)  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    log = (root.parent / f"{root.name}-lab.log").open("w")
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(ROOT / "jupyter")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser",
         "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}",
         "--LabApp.expose_app_in_browser=True",
         f"--LabApp.workspaces_dir={root.parent / f'{root.name}-spaces'}",
         f"--ServerApp.root_dir={root}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}")
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start in two minutes")
        yield url, token, root
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def page(lab, browser_context):
    """A tab of the session's Chromium (conftest.py) that may reach the
    local JupyterLab and nothing else; what it tried to reach elsewhere
    is in ``page.outside``."""
    url, _, _ = lab
    tab = browser_context.new_page()
    tab.outside = []

    def only_local(route):
        if route.request.url.startswith(url):
            route.continue_()
        else:
            tab.outside.append(route.request.url)
            route.abort()

    tab.route("**/*", only_local)
    yield tab
    tab.close()


def open_notebook(page, lab, path: str) -> None:
    url, token, _ = lab
    page.goto(f"{url}/lab/tree/{path}?token={token}")
    page.wait_for_function(  # the notebook asked for, not one restored
        f"() => !!window.jupyterapp && !!{CURRENT} && !!{CURRENT}.context"
        f" && {CURRENT}.context.path === {path!r}",
        timeout=120_000,
    )
    page.wait_for_function(KERNEL_READY, timeout=120_000)
    page.evaluate(f"""() => {{
      const notebook = {CURRENT}.content;
      notebook.activeCellIndex = 0;
      notebook.mode = "command";
      notebook.node.focus();
    }}""")  # the first cell selected, as a click on it would


def first_check(lab):
    """The kit's notebook of CHAPTER, and the index of its first graded
    (check) cell."""
    name = f"ch{CHAPTER}"
    release = nbformat.read(
        lab[2] / "kit" / "assignments" / name / f"{name}.ipynb", 4
    )
    first = next(
        i for i, cell in enumerate(release.cells)
        if cell.metadata.get("nbgrader", {}).get("grade")
    )  # fmt: skip
    return release, first


def test_a_student_runs_the_first_check_and_reads_what_to_do(page, lab):
    name = f"ch{CHAPTER}"
    open_notebook(page, lab, f"kit/assignments/{name}/{name}.ipynb")
    _, first = first_check(lab)
    for _ in range(first + 1):
        page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        f"() => {CURRENT}.content.model.cells.get({first})"
        ".toJSON().outputs.length > 0",
        timeout=120_000,
    )
    (error,) = cell_json(page, first)["outputs"]
    assert error["ename"] == "WrongAnswer"
    assert error["traceback"][0] == "WrongAnswer (exercise 2.1):"
    assert "exercise 2.1 is not done yet" in error["traceback"][1]
    assert len(error["traceback"]) <= 3  # no checker frames
    assert page.outside == []


def test_a_locked_check_cannot_be_edited(page, lab):
    name = f"ch{CHAPTER}"
    open_notebook(page, lab, f"kit/assignments/{name}/{name}.ipynb")
    release, first = first_check(lab)
    assert cell_json(page, first)["metadata"]["editable"] is False
    for _ in range(first):
        page.keyboard.press("j")  # down, in command mode
    page.keyboard.press("Enter")  # edit mode, if the cell allowed it
    page.keyboard.type("pass  # an edit")
    page.keyboard.press("Escape")
    assert cell_json(page, first)["source"] == release.cells[first].source


def test_opening_and_saving_a_chapter_changes_nothing(page, lab):
    """JupyterLab writes the running kernel's spec into what it saves,
    and jupytext writes the paired source: the same as the tracked one."""
    source = lab[2] / "book" / "00_preface.py"
    paired = source.with_suffix(".ipynb")
    before, saved = source.read_text(), paired.stat().st_mtime_ns
    open_notebook(page, lab, "book/00_preface.ipynb")
    page.evaluate(
        "() => window.jupyterapp.commands.execute('docmanager:save')"
    )  # File > Save Notebook
    deadline = time.time() + 60
    while paired.stat().st_mtime_ns == saved and time.time() < deadline:
        time.sleep(0.5)
    assert paired.stat().st_mtime_ns != saved, "JupyterLab did not save"
    time.sleep(1)  # jupytext writes the pair in the same request
    assert source.read_text() == before


def test_a_chapters_source_opens_as_a_notebook(page, lab):
    """A double click on a chapter's ``.py`` opens its default viewer:
    with ``jupyter/labconfig`` that is jupytext's notebook, cells and a
    kernel, not the text editor."""
    open_notebook(page, lab, "book/00_preface.py")
    kind = page.evaluate(
        f"() => [{CURRENT}.context.factoryName,"
        f" {CURRENT}.content.model.cells.length]"
    )
    preface = jupytext.read(ROOT / "notebooks" / "00_preface.py")
    assert kind == ["notebook", len(preface.cells)]  # a text file: "text"
    assert page.outside == []
