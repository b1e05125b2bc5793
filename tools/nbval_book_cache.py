"""pytest plugin: hand the chapters nbval executed to the book build.

``make test`` checks every chapter twice over: nbval executes it as a test,
and the book build renders its outputs. Executing each chapter once is
enough. With ``--book-cache DIR``, after a session in which every cell of
a chapter passed, this plugin stores that chapter, with the outputs nbval
collected, in the book's jupyter-cache at DIR. The book build then finds
it there (jupyter-cache matches a notebook by the hash of its code) and
renders it without running it again. A chapter with a failed or skipped
cell is not stored, so the book build executes it itself and fails on its
own.
"""

from collections import defaultdict

import pytest

FAILED: set[str] = set()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--book-cache",
        default=None,
        help="store chapters that passed under nbval in this jupyter-cache",
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not report.passed:
        FAILED.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--book-cache")
    if not path:
        return
    chapters = defaultdict(list)
    for item in session.items:
        if hasattr(item, "test_outputs") and hasattr(item, "cell"):
            chapters[item.parent].append(item)
    if not chapters:
        return
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(path)
    for chapter, cells in chapters.items():
        if any(c.nodeid in FAILED or c.test_outputs is None for c in cells):
            continue
        for cell in cells:
            cell.cell.outputs = cell.test_outputs
        source = chapter.path.with_suffix(".py")
        cache.cache_notebook_bundle(
            CacheBundleIn(chapter.nb, str(source)),
            check_validity=False,
            overwrite=True,
        )
        print(f"\nbook cache: stored {source.name} as executed by nbval")
