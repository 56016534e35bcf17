"""Shared test fixtures. Servers a test needs are started by the test itself."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.apiserver_fixture", "tests.helpers.role_all"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
