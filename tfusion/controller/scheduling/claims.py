"""Who has which value — a pod index, a host port — for the leader's index and port allocators.

Why one module: both hand a value to a pod being admitted and must not hand it again while that
pod lives. A value is claimed two ways: reserved under the admission's key for `ttl` seconds (the
pod is not in the cache yet, and a pod whose creation failed after admission must not keep it for
ever), and held by a live pod's UID once the cache has it (`occupy`, which ends the reservation).
Counts per value make "is it free?" one lookup, a count of the values in use makes "is every
value taken?" one comparison (a cluster past 128 live GPU pods asks it for every admission), and
reservations expire in the order they were made, so a burst of new pods costs no scan of every
reservation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class Claims:
    """Holders and reservations of integer values (see the module docstring)."""

    def __init__(self, *, ttl: float, now: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.now = now
        self._held: dict[str, int] = {}  # holder -> value
        #: key -> (value, expiry), in expiry order: the expired ones are a prefix
        self._reserved: dict[str, tuple[int, float]] = {}
        #: value -> how many holders and live reservations have it
        self._users: dict[int, int] = {}
        #: how many values have a holder or a live reservation (the non-zero counts above)
        self._values_in_use = 0

    def reservation(self, key: str) -> int | None:
        """The value reserved under `key`, while the reservation lasts."""
        found = self._reserved.get(key)
        return found[0] if found is not None and found[1] > self.now() else None

    def first_free(self, candidates: Iterable[int]) -> int | None:
        """The first of `candidates` nobody holds or has reserved (expired reservations are let go
        first), or None."""
        self._expire()
        users = self._users
        return next((value for value in candidates if not users.get(value)), None)

    def in_use(self) -> int:
        """How many values are held or reserved."""
        self._expire()
        return self._values_in_use

    def reserve(self, key: str, value: int) -> None:
        self._drop_reservation(key)
        self._reserved[key] = (value, self.now() + self.ttl)
        self._count(value, 1)

    def occupy(self, holder: str, value: int, key: str = "") -> None:
        """A live pod holds `value`; its reservation under `key` is no longer needed."""
        self.release(holder)
        self._held[holder] = value
        self._count(value, 1)
        reserved = self._reserved.get(key) if key else None
        if reserved is not None and reserved[0] == value:
            self._drop_reservation(key)

    def release(self, holder: str) -> bool:
        value = self._held.pop(holder, None)
        if value is None:
            return False
        self._count(value, -1)
        return True

    def held(self) -> dict[str, int]:
        return dict(self._held)

    def _count(self, value: int, delta: int) -> None:
        before = self._users.get(value, 0)
        after = self._users[value] = before + delta
        if not before and after:
            self._values_in_use += 1
        elif before and not after:
            self._values_in_use -= 1

    def _drop_reservation(self, key: str) -> None:
        found = self._reserved.pop(key, None)
        if found is not None:
            self._count(found[0], -1)

    def _expire(self) -> None:
        now = self.now()
        while self._reserved:
            key = next(iter(self._reserved))
            if self._reserved[key][1] > now:
                return
            self._drop_reservation(key)
