"""Freed heap memory handed back to the system after large request bodies (`MemoryTrimmer`): every
server that `serve` runs runs the one `MEMORY_TRIMMER`, and the body readers note each large body.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable

import anyio
import anyio.to_thread


class MemoryTrimmer:
    """Hands freed heap memory back to the system after large requests.

    Why: glibc keeps what a process frees in its heaps for reuse, and after a large block is
    freed it raises its threshold for serving allocations from fresh mappings, so the memory of a
    burst of large bodies (parsed in worker threads, which get arenas of their own) stays resident
    after the burst, for good. `malloc_trim(0)` returns the free pages of every arena.

    When: once a burst is over, not during it (a trim walks every arena with its lock held, which
    stalls the event loop's own allocations on a heap of hundreds of MiB): `quiet` seconds after
    the last large body was read or decoded (`note_large_body`), and once more `quiet` seconds
    later for what was still being answered then; or after the resident size grew by `growth`
    bytes since the last trim with no large body noted (a burst on a route that reads its body
    some other way). In a worker thread (ctypes releases the GIL). A no-op where the C library has
    no malloc_trim."""

    def __init__(self, *, quiet: float = 2.0, growth: int = 16 * 1024 * 1024) -> None:
        self.quiet, self.growth = quiet, growth
        self.trims = 0
        self._pending = 0  # trims still owed to the last burst
        self._last_large = 0.0
        self._baseline = 0
        self._lock = threading.Lock()
        self._trim: Callable[[int], int] | None = None
        libc = ctypes.util.find_library("c")
        with contextlib.suppress(OSError, AttributeError):
            self._trim = ctypes.CDLL(libc).malloc_trim if libc else None

    def note_large_body(self) -> None:
        self._pending, self._last_large = 2, time.monotonic()

    async def run(self) -> None:
        """Until cancelled; every server runs one, and they share the work (one trim per occasion)."""
        if self._trim is None:
            return
        while True:
            await anyio.sleep(self.quiet)
            if self._due() and self._lock.acquire(blocking=False):
                try:
                    await anyio.to_thread.run_sync(self.trim_now)
                finally:
                    self._lock.release()

    def _due(self) -> bool:
        if time.monotonic() - self._last_large < self.quiet:
            return False
        return self._pending > 0 or _resident_bytes() > self._baseline + self.growth

    def trim_now(self) -> None:
        self._pending = max(0, self._pending - 1)
        if self._pending:  # the next one `quiet` seconds from now
            self._last_large = time.monotonic()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
        self._baseline = _resident_bytes()


def _resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MEMORY_TRIMMER = MemoryTrimmer()
