"""The browser tests may run in several pytest-xdist workers at once
(``make browser-test``): each starts its own server and Chromium, and
only the main process of a browser run clears the screenshots of an
earlier one."""

import shutil

from test_book_in_browser import SCREENSHOTS


def pytest_configure(config):
    worker = hasattr(config, "workerinput")
    browser_run = config.getoption("markexpr", "") == "browser"
    if browser_run and not worker:
        shutil.rmtree(SCREENSHOTS, ignore_errors=True)
