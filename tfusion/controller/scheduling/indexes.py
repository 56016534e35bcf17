"""The pod index allocator: which of the 128 device-plugin handshake indices a new GPU pod gets.

Why: the hypervisor's device plugin learns which pod a container belongs to from the index
resource the pod asks for (`<domain>/index_<k>` with count c, index N = 8k + c, 1..128; see
`tfusion.api.podindex.encode_pod_index`). Two pods pending on one node at the same time must
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
from collections.abc import Callable

from tfusion.allocator.request import pod_index_of
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.controller.scheduling.claims import Claims

POD_INDEX_MAX = tfa.POD_INDEX_MAX
RESERVATION_TTL_S = 60.0


def pod_index(pod: Pod) -> int | None:
    """The index a pod's containers ask for (the first index resource found), or None. The one
    reading of it is the allocator's (`pod_index_of`): the node-level lock reads the same."""
    return pod_index_of(pod) or None


class IndexAllocator:
    """Pure state: the claims on the 128 indices (claims.py) and a moving cursor."""

    def __init__(self, *, reservation_ttl: float = RESERVATION_TTL_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.claims = Claims(ttl=reservation_ttl, now=now)
        self._next = 1

    def assign(self, key: str) -> int:
        """An index for the pod being admitted under `key` (its namespace/name, or a unique key for
        a generateName pod); asking again with the same key returns the same index."""
        known = self.claims.reservation(key)
        if known is not None:
            return known
        chosen = self._next  # all held (past 128 live GPU pods, the usual case): the counter repeats one
        if self.claims.in_use() < POD_INDEX_MAX:
            rotation = ((self._next - 1 + step) % POD_INDEX_MAX + 1 for step in range(POD_INDEX_MAX))
            chosen = self.claims.first_free(rotation) or chosen
        self._next = chosen % POD_INDEX_MAX + 1
        self.claims.reserve(key, chosen)
        return chosen

    def occupy(self, holder: str, index: int, key: str = "") -> None:
        """A live pod holds `index` (from the cache); its reservation under `key` is no longer needed."""
        self.claims.occupy(holder, index, key)

    def release(self, holder: str) -> bool:
        return self.claims.release(holder)

    def held(self) -> dict[str, int]:
        return self.claims.held()
