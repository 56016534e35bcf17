"""Where Chromium or Playwright is missing, browser tests skip and the reason names what to install.

The machines that run the suite usually have both, so the skip path is checked here by hiding them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import browser


def test_nothing_is_missing_when_both_are_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(browser, "CHROMIUM", str(fake))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert browser.chromium_path() == str(fake)
    assert browser.browser_missing() == ""


def test_the_reason_names_chromium_and_playwright(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", str(tmp_path / "absent"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert browser.chromium_path() is None
    reason = browser.browser_missing()
    assert "chromium" in reason and "which .ci/run installs" in reason
    assert "the playwright Python package" in reason


def test_screenshots_go_where_the_environment_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(browser.SCREENSHOTS_ENV, str(tmp_path / "shots"))
    assert browser.screenshot_directory(tmp_path / "default") == tmp_path / "shots"
    monkeypatch.delenv(browser.SCREENSHOTS_ENV)
    assert browser.screenshot_directory(tmp_path / "default") == tmp_path / "default"
    assert (tmp_path / "default").is_dir()
