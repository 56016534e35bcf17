"""Shared test fixtures. Servers a test needs are started by the test itself."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.apiserver_fixture", "tests.helpers.role_all", "tests.helpers.browser"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A fresh directory with a short path, for tests that create unix sockets in it.

    A socket's path may not pass 107 bytes, and pytest's `tmp_path` (longer still under a parallel
    run, which adds a worker directory) can: the device plugins' sockets then fail to bind.
    """
    path = Path(tempfile.mkdtemp(prefix="tf-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
