"""Small helpers several test modules share: polling for a condition, a port nothing listens on, and a
clock a test moves by hand."""

from __future__ import annotations

import resource
from collections.abc import Awaitable, Callable

import anyio

from tfusion.web import bind_socket


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
