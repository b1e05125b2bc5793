"""What the browser tests share: one headless Chromium for the session
(Playwright's sync API allows one running instance per thread), driven
by the ``playwright`` package with Debian's ``chromium``."""

import shutil

import pytest
from playwright.sync_api import sync_playwright

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # runs as root in CI
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


WAIT_MS = 90_000  # the longest wait for a page, its maths or a chart


@pytest.fixture(scope="session")
def browser_context():
    """Headless Chromium with a fresh profile (playwright makes one)."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium not found: `make browser-test` installs it")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        # make browser-test runs two of these side by side on two cores:
        # a long chapter's page can take several times its quiet time
        context.set_default_timeout(WAIT_MS)
        context.set_default_navigation_timeout(WAIT_MS)
        yield context
        context.close()
        browser.close()
