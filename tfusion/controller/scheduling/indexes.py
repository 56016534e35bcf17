"""The pod index allocator: which of the 128 device-plugin handshake indices a new GPU pod gets.

Why: the hypervisor's device plugin learns which pod a container belongs to from the index
resource the pod asks for (`<domain>/index_<k>` with count c, index N = 8k + c, 1..128; see
`tfusion.api.annotations.encode_pod_index`). Two pods pending on one node at the same time must
not share an index. The leader owns this allocator; it is rebuilt from the pods in the cache at
the start of every leadership term (`occupy`), pods release theirs when deleted or finished
(`release`), and a fresh assignment is reserved for `reservation_ttl` seconds so that the pod it
was made for is seen in the cache before the index could be handed out again.

The original hands out a plain counter, ((n-1) mod 128) + 1, whatever is in use; here the counter
moves on the same way but skips indices that a live pod holds, and repeats one only when all 128
are held.

This is the cluster-level half. The node-level half (no two pods holding GPUs on one node share
an index, whatever the cluster-level counter handed out) is the allocator's
(tfusion/allocator/indexlock.py), checked at Reserve and once more at the Binding (binder.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tfusion.allocator.request import pod_index_of
from tfusion.api import annotations as tfa

POD_INDEX_MAX = tfa.POD_INDEX_MAX
RESERVATION_TTL_S = 60.0


def pod_index(pod: Mapping[str, Any]) -> int | None:
    """The index a pod's containers ask for (the first index resource found), or None. The one
    reading of it is the allocator's (`pod_index_of`): the node-level lock reads the same."""
    return pod_index_of(pod) or None


class IndexAllocator:
    """Pure state: held indices by holder (a pod UID or an assignment's key) and a moving cursor."""

    def __init__(self, *, reservation_ttl: float = RESERVATION_TTL_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.reservation_ttl = reservation_ttl
        self.now = now
        self._held: dict[str, int] = {}  # holder -> index
        #: assignment key -> (index, expiry), in expiry order: the expired ones are a prefix
        self._reserved: dict[str, tuple[int, float]] = {}
        #: index -> how many holders and live reservations have it (a burst of new pods costs
        #: each assignment a look at these counts, not a scan of every reservation)
        self._users: dict[int, int] = {}
        self._next = 1

    def _count(self, index: int, delta: int) -> None:
        self._users[index] = self._users.get(index, 0) + delta

    def _expire(self, now: float) -> None:
        while self._reserved:
            key = next(iter(self._reserved))
            index, expiry = self._reserved[key]
            if expiry > now:
                return
            del self._reserved[key]
            self._count(index, -1)

    def assign(self, key: str) -> int:
        """An index for the pod being admitted under `key` (its namespace/name, or a unique key for
        a generateName pod); asking again with the same key returns the same index."""
        now = self.now()
        found = self._reserved.get(key)
        if found is not None and found[1] > now:
            return found[0]
        self._expire(now)  # an expired reservation under this key goes with the others
        chosen = self._next
        for step in range(POD_INDEX_MAX):
            candidate = (self._next - 1 + step) % POD_INDEX_MAX + 1
            if not self._users.get(candidate):
                chosen = candidate
                break
        self._next = chosen % POD_INDEX_MAX + 1
        self._reserved[key] = (chosen, now + self.reservation_ttl)
        self._count(chosen, 1)
        return chosen

    def occupy(self, holder: str, index: int, key: str = "") -> None:
        """A live pod holds `index` (from the cache); its reservation under `key` is no longer needed."""
        old = self._held.get(holder)
        if old is not None:
            self._count(old, -1)
        self._held[holder] = index
        self._count(index, 1)
        reserved = self._reserved.get(key) if key else None
        if reserved is not None and reserved[0] == index:
            del self._reserved[key]
            self._count(index, -1)

    def release(self, holder: str) -> bool:
        index = self._held.pop(holder, None)
        if index is None:
            return False
        self._count(index, -1)
        return True

    def held(self) -> dict[str, int]:
        return dict(self._held)
