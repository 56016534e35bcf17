"""The cyclic garbage collector held off while informers fill their caches.

Why: an initial list of 100,000 pods allocates tens of millions of containers; CPython runs a
collection every 700 net allocations and a full one each time the long-lived generation grows by a
quarter, so while a cache fills the collector walks the growing cache again and again (seconds of
CPU at that size) and finds nothing: decoded JSON holds no reference cycles, and what a page
leaves behind is freed by reference counting alone. Paused across every list in progress, it runs
again once the last one ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: lists in progress, and whether the collector was enabled when the first of them began
_paused_by = 0
_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; nested and concurrent blocks (many informers
    listing at once in one event loop) share one pause, lifted when the last block ends. A
    collector that was disabled before the first block stays disabled."""
    global _paused_by, _was_enabled
    if _paused_by == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _paused_by += 1
    try:
        yield
    finally:
        _paused_by -= 1
        if _paused_by == 0 and _was_enabled:
            gc.enable()
