"""Small helpers several test modules share, so each rule a test relies on is written once: polling for
a condition, a port nothing listens on, a clock a test moves by hand, the check that nothing was
logged at ERROR, file modes under the widest umask, reading a raw connection until the server
closes it, and a JSON document with one field changed."""

from __future__ import annotations

import copy
import logging
import os
import resource
import socket
import stat
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from tfusion.web import bind_socket

T = TypeVar("T")


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll the async `predicate` until it is true; TimeoutError after `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not await predicate():
            await anyio.sleep(0.05)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    sock = bind_socket("127.0.0.1:0")
    port: int = sock.getsockname()[1]
    sock.close()
    return port


class Clock:
    """A time source for code that takes `clock=`: starts at 1000.0, tests set `.now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (in-process servers included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def logged_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the test's setup and call logged at ERROR or with a traceback, as "logger: message".
    Read at teardown: caplog.records then holds only teardown's own records."""
    records = caplog.get_records("setup") + caplog.get_records("call")
    return [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR or r.exc_info]


def no_error_logged_fixture(*, autouse: bool) -> Any:
    """A fixture named `no_error_logged` that fails the test if its setup or call logged at ERROR or
    with a traceback (a 5xx is one: the server logs the traceback of every internal error). Bind it
    in the module: `no_error_logged = no_error_logged_fixture(autouse=True)`."""

    @pytest.fixture(autouse=autouse, name="no_error_logged")
    def fixture(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
        with caplog.at_level(logging.WARNING):  # a traceback may come with a WARNING
            yield
        errors = logged_errors(caplog)
        assert not errors, errors

    return fixture


@contextmanager
def widest_umask() -> Iterator[None]:
    """umask 0 inside: every mode a test then reads is the one the code set, not one the umask narrowed."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def file_mode(path: Path) -> int:
    """The permission bits of `path` (what chmod sets), without the file type."""
    return stat.S_IMODE(os.stat(path).st_mode)


def read_until_closed(sock: socket.socket, seconds: float) -> bytes:
    """All the server sends until it closes the connection (a reset after its answer counts as a
    close); fails the test if the connection stays open and silent for `seconds`."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection is still open after {seconds} s; received {received[:300]!r}")
    return received


def with_field(base: T, path: tuple[Any, ...], value: Any) -> T:
    """A deep copy of the JSON-like `base` with the field at `path` (keys and list indexes) set to
    `value`; `base` itself is left as it was. An empty path gives `value`."""
    if not path:
        replaced: T = value
        return replaced
    changed = copy.deepcopy(base)
    target: Any = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return changed
