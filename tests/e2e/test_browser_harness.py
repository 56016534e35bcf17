"""The browser harness itself: a page's console errors and uncaught exceptions reach the test.

Why: every console test ends with `assert_no_errors()`; if the listeners silently caught nothing,
those assertions could never fail. A data: URL page needs no server.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.helpers.browser import BrowserPage, needs_browser, screenshot

pytestmark = needs_browser

FAULTY = """<!doctype html><title>faulty</title><p id="p">loaded</p>
<script>console.error("synthetic failure 31"); console.log("just a log");
setTimeout(() => { throw new Error("thrown later 31"); }, 0);</script>"""
CLEAN = """<!doctype html><title>clean</title><p id="p">fine</p><script>console.log("all well");</script>"""


def _load(browser_page: BrowserPage, html: str) -> None:
    browser_page.page.goto("data:text/html," + quote(html))
    browser_page.page.wait_for_selector("#p")


def test_console_errors_and_uncaught_exceptions_are_collected(browser_page: BrowserPage) -> None:
    _load(browser_page, FAULTY)
    errors = browser_page.errors
    for _ in range(200):  # up to 10 s; Playwright delivers events only while it is called, hence its own wait
        if len(errors) >= 2:
            break
        browser_page.page.wait_for_timeout(50)
    assert any("console error" in e and "synthetic failure 31" in e for e in errors), errors
    assert any("uncaught exception" in e and "thrown later 31" in e for e in errors), errors
    assert not any("just a log" in e for e in errors)
    with pytest.raises(AssertionError, match="synthetic failure 31"):
        browser_page.assert_no_errors()


def test_a_clean_page_has_no_errors_and_its_screenshot_is_a_png(browser_page: BrowserPage) -> None:
    _load(browser_page, CLEAN)
    assert browser_page.page.inner_text("#p") == "fine"
    browser_page.assert_no_errors()
    path = browser_page.screenshot("harness-clean")
    assert path.parent == browser_page.directory
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"screenshot name '\.\./x' is not allowed"):
        screenshot(browser_page.page, "../x")
