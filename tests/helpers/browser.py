"""A real browser for the console's end-to-end tests: Debian's Chromium, headless, driven by Playwright.

Why it exists: the console is pages plus a little JavaScript that polls fragments; whether it
works is only known in a browser (a template that renders but whose script throws looks fine to
an HTTP client). Playwright drives the system's Chromium (`executable_path`), so nothing is
downloaded: `.ci/run` installs the `chromium` package, and the `playwright` Python package comes
with the dev extra. Without either the tests skip and say which is missing.

Use the `browser_page` fixture (registered for every test by tests/conftest.py); it yields a
`BrowserPage` whose `errors` collects the page's console errors and uncaught exceptions, which a
test asserts empty (`assert_no_errors()`). Screenshots go under `$TFUSION_SCREENSHOTS` when set
(the closing note's pictures), else under the test's temporary directory.

The sync API: it cannot run inside a running event loop, so browser tests are plain sync tests
(the servers they look at run in other processes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page, ViewportSize

#: Debian's package installs it here; elsewhere whatever `chromium` is on PATH
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS_ENV = "TFUSION_SCREENSHOTS"
#: a laptop screen; tests of the narrow layout set their own size
VIEWPORT: ViewportSize = {"width": 1366, "height": 820}
#: generous: the machine running the suite is shared, and a wait ends as soon as its condition holds
TIMEOUT_MS = 15_000
#: --no-sandbox: CI runs as root in a container, where Chromium's sandbox cannot start;
#: --disable-dev-shm-usage: containers often have a tiny /dev/shm, which crashes renderers
LAUNCH_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")


def chromium_path() -> str | None:
    """The Chromium to drive, or None when there is none."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


def browser_missing() -> str:
    """Why browser tests cannot run here ("" when they can)."""
    missing = []
    if chromium_path() is None:
        missing.append(f"chromium ({CHROMIUM} or on PATH; Debian package `chromium`, which .ci/run installs)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright Python package (pip install -e '.[dev]')")
    return "browser tests need " + " and ".join(missing) if missing else ""


#: for tests that drive the browser: skips, saying what is missing, where it cannot run
needs_browser = pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "browser present")


def screenshot_directory(default: Path | None = None) -> Path:
    """$TFUSION_SCREENSHOTS when set, else `default`, else a directory under the system's temp dir."""
    given = os.environ.get(SCREENSHOTS_ENV)
    if given:
        path = Path(given)
    else:
        path = default if default is not None else Path(tempfile.gettempdir()) / "tfusion-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page: Page, name: str, directory: Path | None = None) -> Path:
    """The whole page as `<directory>/<name>.png` (see `screenshot_directory`); returns the path."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"screenshot name {name!r} is not allowed; expected lowercase letters, digits, '.', '_' "
                         "and '-', starting with a letter or digit, at most 100 characters")
    path = screenshot_directory(directory) / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@dataclass
class BrowserPage:
    """A fresh page in its own browser context, and what went wrong on it."""

    page: Page
    directory: Path
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        return screenshot(self.page, name, self.directory)

    def assert_no_errors(self) -> None:
        assert not self.errors, "the browser reported errors:\n" + "\n".join(self.errors)

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location
            at = f" at {where.get('url')}:{where.get('lineNumber')}" if where and where.get("url") else ""
            self.errors.append(f"console error{at}: {message.text}")

    def _on_page_error(self, error: Exception) -> None:
        self.errors.append(f"uncaught exception: {error}")


@pytest.fixture
def chromium() -> Iterator[Browser]:
    """A headless Chromium for one test. Not one per session: while Playwright's sync API is open it
    holds an event loop on the thread, and every anyio test that the same worker runs later would
    fail with "Cannot run the event loop while another loop is running"."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    assert path is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Browser, tmp_path: Path) -> Iterator[BrowserPage]:
    """A page with console errors and uncaught exceptions collected into `.errors`."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    result = BrowserPage(page=page, directory=screenshot_directory(tmp_path / "screenshots"))
    page.on("console", result._on_console)
    page.on("pageerror", result._on_page_error)
    try:
        yield result
    finally:
        context.close()
