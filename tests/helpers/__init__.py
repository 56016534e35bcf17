"""What tests share, written once. This package's modules, each named for what it provides:

- here: waiting for a condition (`eventually` in async tests, `wait_until` in sync ones: the check
  first, then `timeout`, then `what` to name in the failure), a port nothing listens on, a clock a
  test moves by hand, the check that nothing was logged at ERROR, file modes under the widest umask,
  reading a raw connection until the server closes it, and a JSON document with one field changed;
- `controller`, `webhook`, `scheduler`, `scheduler_index`, `progressive`: an in-process controller
  (and its webhook) on the embedded API server, and the GPU, pool, node and pod objects its tests create;
- `kube_hypervisor`, `local_hypervisor`, `device_plugin`, `soft_isolation`: a hypervisor in a test;
- `hypervisor_process`, `controller_process`, `role_all`: tfusion started as a separate process;
- `refusals`, `deploy`, `mutate_inputs`, `allocator`, `metrics`, `cli`: checks and inputs several test
  modules use;
- `kubectl`, `official_client`: the real kubectl (its path, the skip mark, a runner on one kubeconfig)
  and the official `kubernetes` client on a kubeconfig; `clock`: `Wall`, the hand-moved clock at today's epoch;
- `browser`: headless Chromium through Playwright (the `browser_page` fixture, `needs_browser`, screenshots);
  `console_cluster`: a settled cluster's objects at any size, for the console's views and benchmark.

Builders take the object's name first, then keyword arguments; those that create an object take the
client first (`create_gpu(kube, name, node, ...)`). A test module never imports another test module:
what two of them need lives here. The embedded API server fixture is in tests/apiserver_fixture.py."""

from __future__ import annotations

import copy
import gc
import inspect
import logging
import os
import resource
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, overload

import anyio
import pytest

from tfusion.web import bind_socket

T = TypeVar("T")


@overload
async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = ..., what: str = ..., *,
                     retry_on: tuple[type[BaseException], ...] = ...) -> T: ...
@overload
async def eventually(check: Callable[[], T | None], timeout: float = ..., what: str = ..., *,
                     retry_on: tuple[type[BaseException], ...] = ...) -> T: ...
async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "", *,
                     retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Call `check` (sync or async) every 50 ms until it returns a truthy value, and return that value.
    A check that raises one of `retry_on` is tried again too (AssertionError for a check written with
    asserts, which then returns True when they pass). After `timeout` seconds the test fails, naming
    `what` and the last value or error."""
    last: object = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                result = check()
                value = await result if inspect.isawaitable(result) else result
            except retry_on as exc:
                last = exc
            else:
                if value:
                    return value
                last = value
            await anyio.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what or getattr(check, '__name__', check)}: last {last!r}")


def wait_until(check: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
    """`eventually` for sync tests: poll the plain function `check` until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or getattr(check, '__name__', check)}: "
                        f"last {value!r}")
        time.sleep(0.05)


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


def logged_errors(caplog: pytest.LogCaptureFixture, *, skip_setup: int = 0) -> list[str]:
    """What the test's setup (past its first `skip_setup` records) and call logged at ERROR or with a
    traceback, as "logger: message". Read at teardown: caplog.records then holds only teardown's own."""
    records = caplog.get_records("setup")[skip_setup:] + caplog.get_records("call")
    return [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR or r.exc_info]


def no_error_logged_fixture(*, autouse: bool) -> Any:
    """A fixture named `no_error_logged` that fails the test if its setup or call logged at ERROR or
    with a traceback (a 5xx is one: the server logs the traceback of every internal error). Bind it
    in the module: `no_error_logged = no_error_logged_fixture(autouse=True)`."""

    @pytest.fixture(autouse=autouse, name="no_error_logged")
    def fixture(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
        # what earlier tests of this worker left for the garbage collector (an event loop closed with
        # a server's accept tasks pending logs "Task was destroyed") is collected now, not blamed here
        gc.collect()
        earlier = len(caplog.get_records("setup"))
        with caplog.at_level(logging.WARNING):  # a traceback may come with a WARNING
            yield
        errors = logged_errors(caplog, skip_setup=earlier)
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
