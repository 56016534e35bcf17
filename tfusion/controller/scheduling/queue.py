"""The built-in scheduler's queue of pending pods: active, backing off, or parked as unschedulable.

Why not the reconcilers' WorkQueue: a pod that does not fit must not be retried on a timer alone
(thousands of pending pods retried every few seconds would be a CPU and event storm), yet it must
be retried at once when something happens that can make it fit. kube-scheduler's answer, kept
here in a small form:

- **active**: pods to try now, highest priority first, then oldest first;
- **backoff**: pods whose last attempt failed, waiting 1 s, 2 s, 4 s … up to 10 s (per pod, by
  attempts) before they become active again;
- **unschedulable**: pods the last attempt found no room for. They stay parked until `move_all`
  is called for an event that can make them fit (a GPU's available grew, a node was added or
  changed, a GPU pod was deleted, a quota changed), and at the latest after
  `UNSCHEDULABLE_FLUSH_S` (a safety net for an event nobody reported). A moved pod whose backoff
  has not run out goes to backoff, else to active.

A move that happens while a pod is being tried (between `pop` and `unschedulable`) is not lost:
each pop records the move counter, and a pod reported unschedulable after a move since its pop
goes to backoff instead of being parked.

Time comes from the injected `Clock`, so tests move it by hand. Keys are opaque (the scheduler
uses "namespace/name"); `priority` is the pod's `spec.priority`.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import anyio

from tfusion.kube.backoff import Backoff
from tfusion.kube.clock import REAL_CLOCK, Clock

INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
BACKOFF_POLICY = Backoff(base=INITIAL_BACKOFF_S, cap=MAX_BACKOFF_S)
#: parked pods are retried at least this often even when no event moved them
UNSCHEDULABLE_FLUSH_S = 60.0

ACTIVE, BACKOFF, UNSCHEDULABLE, IN_FLIGHT = "active", "backoff", "unschedulable", "in-flight"


@dataclass
class _Entry:
    key: str
    priority: int = 0
    added_at: float = 0.0
    attempts: int = 0
    #: when the current backoff ends (clock time)
    backoff_until: float = 0.0
    #: when it was parked as unschedulable (clock time)
    parked_at: float = 0.0
    #: the move counter when it was last popped
    popped_at_move: int = -1
    where: str = ACTIVE
    #: the heap sequence of its live heap entry (older heap entries are stale)
    seq: int = field(default=-1)


def backoff_for(attempts: int) -> float:
    """1 s after the first failure, doubling per failure, at most 10 s."""
    return BACKOFF_POLICY.delay(attempts)


class SchedulingQueue:
    """See the module docstring. Not thread-safe; one event loop."""

    def __init__(self, *, clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._active: list[tuple[int, float, int, str]] = []  # (-priority, added_at, seq, key)
        # (due time, seq, key): a backoff's end, or when a parked pod is flushed; an entry whose
        # seq is not the pod's current one is stale and skipped
        self._timed: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._moves = 0
        self._changed = anyio.Event()
        self._closed = False

    # --- reading ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def where(self, key: str) -> str | None:
        """active, backoff, unschedulable, in-flight, or None when not queued."""
        entry = self._entries.get(key)
        return entry.where if entry is not None else None

    def attempts(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.attempts if entry is not None else 0

    def counts(self) -> dict[str, int]:
        out = {ACTIVE: 0, BACKOFF: 0, UNSCHEDULABLE: 0, IN_FLIGHT: 0}
        for entry in self._entries.values():
            out[entry.where] += 1
        return out

    # --- changing ---------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _activate(self, entry: _Entry) -> None:
        entry.where = ACTIVE
        entry.seq = next(self._seq)
        heapq.heappush(self._active, (-entry.priority, entry.added_at, entry.seq, entry.key))
        self._notify()

    def add(self, key: str, *, priority: int = 0) -> None:
        """A pending pod was seen (added or changed). A new pod becomes active; one that is
        parked becomes active too (its spec or annotations may have changed); one backing off or
        being tried stays where it is."""
        if self._closed:
            return
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(key, priority, self.clock.now())
            self._activate(entry)
            return
        entry.priority = priority
        if entry.where == UNSCHEDULABLE:
            self._release_parked(entry)

    def delete(self, key: str) -> None:
        """The pod is gone, bound or no longer ours; a stale heap entry is skipped on pop."""
        self._entries.pop(key, None)

    def done(self, key: str) -> None:
        """The pod was placed (binding runs on): it leaves the queue."""
        self.delete(key)

    def _wait_until(self, entry: _Entry, where: str, due: float) -> None:
        entry.where = where
        entry.seq = next(self._seq)
        heapq.heappush(self._timed, (due, entry.seq, entry.key))
        self._notify()

    def _back_off(self, entry: _Entry) -> None:
        self._wait_until(entry, BACKOFF, entry.backoff_until)

    def _release_parked(self, entry: _Entry) -> None:
        if entry.backoff_until > self.clock.now():
            self._back_off(entry)
        else:
            self._activate(entry)

    def unschedulable(self, key: str) -> None:
        """The attempt found no room: park it, or back off when something moved meanwhile."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.attempts += 1
        now = self.clock.now()
        entry.backoff_until = now + backoff_for(entry.attempts)
        if entry.popped_at_move < self._moves:
            self._back_off(entry)
        else:
            entry.parked_at = now
            self._wait_until(entry, UNSCHEDULABLE, now + UNSCHEDULABLE_FLUSH_S)

    def error(self, key: str) -> None:
        """The attempt failed for another reason (API error, binding refused): back off."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.attempts += 1
        entry.backoff_until = self.clock.now() + backoff_for(entry.attempts)
        self._back_off(entry)

    def park(self, key: str) -> None:
        """Parked until an event moves it, without counting a failed attempt (a gang member whose
        peers are still being created: no backoff grows while they come)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        now = self.clock.now()
        if entry.popped_at_move < self._moves:
            self._activate(entry)
            return
        entry.parked_at = now
        self._wait_until(entry, UNSCHEDULABLE, now + UNSCHEDULABLE_FLUSH_S)

    def hold_until(self, key: str, due: float) -> None:
        """Not before `due`, whatever its attempts (a gang backing off after a timeout)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.backoff_until = max(entry.backoff_until, due)
        self._back_off(entry)

    def move_all(self) -> int:
        """An event that can make parked pods fit: every parked pod goes to backoff or active.
        Returns how many were moved."""
        self._moves += 1
        moved = 0
        for entry in self._entries.values():
            if entry.where == UNSCHEDULABLE:
                self._release_parked(entry)
                moved += 1
        return moved

    def close(self) -> None:
        """Wake every `pop` with `QueueClosed` (leadership ended)."""
        self._closed = True
        self._notify()

    # --- time ----------------------------------------------------------------------------------------

    def flush(self) -> float | None:
        """Move what is due: ended backoffs to active, pods parked too long to backoff/active.
        Returns the clock time of the next thing due, or None when nothing waits on time."""
        now = self.clock.now()
        while self._timed:
            due, seq, key = self._timed[0]
            entry = self._entries.get(key)
            if entry is None or entry.seq != seq or entry.where not in (BACKOFF, UNSCHEDULABLE):
                heapq.heappop(self._timed)
                continue
            if due > now:
                return due
            heapq.heappop(self._timed)
            if entry.where == BACKOFF:
                self._activate(entry)
            else:
                self._release_parked(entry)
        return None

    def _pop_active(self) -> str | None:
        while self._active:
            _, _, seq, key = heapq.heappop(self._active)
            entry = self._entries.get(key)
            if entry is not None and entry.where == ACTIVE and entry.seq == seq:
                entry.where = IN_FLIGHT
                entry.popped_at_move = self._moves
                return key
        return None

    async def pop(self) -> str:
        """The next pod to try, waiting (on the clock) for one. Raises QueueClosed once closed."""
        while True:
            if self._closed:
                raise QueueClosed()
            next_due = self.flush()
            key = self._pop_active()
            if key is not None:
                return key
            changed = self._changed
            wait = None if next_due is None else max(0.0, next_due - self.clock.now())
            if wait is None:
                await changed.wait()
            else:
                with self.clock.move_on_after(wait):
                    await changed.wait()


class QueueClosed(Exception):
    """The queue was closed while a pop waited."""
