"""The webhook's memory of pods it has mutated: a pod identical to one seen before, under the same
cluster state, skips the analysis, the rendering and the JSON diff.

Why: a Deployment's, ReplicaSet's or Job's replicas reach the webhook as byte-identical pods (no
name yet, the same generateName, template, labels and owner), and that burst is when the webhook
is busiest. The mutation is a pure function of the pod as sent, its namespace, the cached objects
`analyse` reads (pools, provider configs, quotas, workload profiles, scheduling templates,
namespaces and, for compute-percent pods, GPU capacities), the dynamic config, the pod's resolved
owner and its index. `ReviewMemo` keeps the plan, and the JSON patch for each index a pod got, under
the pod's bytes (without the managedFields kube-apiserver stamps to the second) and namespace. The
index is rendered once for all: the patch made with marks where the index goes (render.ANY_INDEX)
is kept too, and each new index's patch is that text with the marks replaced (render.with_index),
since a Deployment's pods get one index after another (1 to 128) and rendering them was most of a
memo hit's cost (where the index goes nowhere else: render.renders_any_index). An entry holds while
every informer it read has the same `generation` (a counter of changes to its store other than
status writes), the dynamic config is the same object and the owner resolves the same; the GPU
capacities it looked up are compared again.

Named pods without a controller (pods created one by one, by a script or a person) are never
byte-identical: they differ in their name, which their plan reads only as their workload's name.
The webhook (service.py, `_mutate_shared`) keys them by their shape instead, the pod under one
placeholder name, and keeps the shape's plan and its patches as JSON text holding the placeholder
where the name goes; each pod gets them with its own name written in (and its own workload and
index). Such an entry's key holds the placeholder, so it never meets a key of bytes as sent. A pod
whose shape is held was checked (bounds, field types) as that shape and is not checked again.

A key is kept from its second pod on: the first only leaves a mark (the key's hash, in a bounded
set of marks). A pod whose like never comes again (a script's pods that each carry an argument of
their own) would only push out entries that do come again; and on CPython 3.11, entries that
replace evicted ones grow the collector's youngest generation without counting towards its
collection (the count is allocations minus frees, and each eviction frees as much as an entry
allocates), so a stream of such pods ended in young collections of ~95,000 objects that held the
event loop 25 ms each. The second pod of a script's run pays the analysis once more. A pod whose
owner asks for more than one replica is kept from the first: its siblings are on their way (a
cluster of small Deployments otherwise analysed two pods of each).

What it never skips: the owner lookup (itself cached), the index assignment, the workload check,
and everything for the plans it does not keep, which claim or read something per pod: a host port,
the grey-release counter, a workload recommendation (it moves with the workload's status), remote
vGPU (its connection name has a random suffix), and an unowned pod without a name (so has its
workload's). Memory is bounded by the bytes of the pods and patches it holds (`max_bytes`, least
recently used out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from tfusion.api.jsontypes import JsonObject
from tfusion.controller.webhook.mutate import Owner, Plan

MAX_BYTES = 16 * 1024 * 1024
#: first sightings remembered (their keys' hashes), newest; the older half is forgotten at once
MAX_MARKS = 16_384

#: the pod's JSON as sent (see service._memo_bytes) and its namespace
Key = tuple[bytes, str]


@dataclass(frozen=True)
class State:
    """What an answer was computed from: the generations of the informers `analyse` reads and the
    dynamic config (replaced, not changed, when it reloads: compared by identity)."""

    generations: tuple[int, ...]
    config: object

    def holds(self, now: State) -> bool:
        return self.config is now.config and self.generations == now.generations


@dataclass
class Remembered:
    state: State
    owner: Owner
    plan: Plan
    #: the GPU capacities the analysis looked up (compute percent, dedicated GPUs), by model: GPU
    #: status changes with every allocation, so these are compared instead of a generation
    gpu_reads: dict[str, object]
    #: the base64 JSON patch for each index (None: no index); for a shape, the JSON text (see above);
    #: under render.ANY_INDEX, the JSON text with the index's marks (service._any_index)
    patches: dict[int | None, str] = field(default_factory=dict)
    #: a shape's workload as last handed out under a pod's name (name, workload): the same pod sent
    #: again gets the very object, which the workload writer recognises without comparing it
    named_workload: tuple[str, JsonObject] | None = None


def keeps(plan: Plan, owner: Owner, pod_named: bool) -> bool:
    """Whether a plan is the same for every identical pod (see the module docstring)."""
    return (plan.host_port is None and plan.enabled_replicas is None and plan.remote is None
            and (owner.reference is not None or pod_named))


class ReviewMemo:
    """See the module docstring."""

    def __init__(self, *, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, Remembered] = OrderedDict()
        self._bytes = 0
        #: the hashes of keys seen once, in two halves: `_marks` fills, then becomes `_older`
        self._marks: set[int] = set()
        self._older: set[int] = set()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: Key, now: State, owner: Owner, capacity: Callable[[str], object]) -> Remembered | None:
        """The answer for this pod if it still holds: same state and owner, and `capacity` gives
        what the analysis read for each GPU model it looked up."""
        found = self._entries.get(key)
        if (found is None or found.owner != owner or not found.state.holds(now)
                or any(capacity(model) != seen for model, seen in found.gpu_reads.items())):
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def remember(self, key: Key, entry: Remembered) -> None:
        """Keep `entry` under `key`, unless this is the first time `key` is seen and its owner
        promises no more replicas (see the module docstring): then only mark it."""
        siblings = (entry.owner.replicas or 0) > 1
        if key not in self._entries and not siblings and not self._seen_before(key):
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= _size(key, old)
        self._entries[key] = entry
        self._bytes += _size(key, entry)
        self._trim()

    def _seen_before(self, key: Key) -> bool:
        mark = hash(key)
        if mark in self._marks or mark in self._older:
            self._marks.discard(mark)
            self._older.discard(mark)
            return True
        if len(self._marks) >= MAX_MARKS // 2:
            self._older, self._marks = self._marks, set()
        self._marks.add(mark)
        return False

    def holds(self, key: Key, entry: Remembered) -> bool:
        """Whether `entry` is the one kept under `key` (not a first sighting's, only marked)."""
        return self._entries.get(key) is entry

    def add_patch(self, key: Key, entry: Remembered, index: int | None, patch: str) -> None:
        if self.holds(key, entry) and index not in entry.patches:
            entry.patches[index] = patch
            self._bytes += len(patch)
            self._trim()

    def _trim(self) -> None:
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            key, oldest = self._entries.popitem(last=False)
            self._bytes -= _size(key, oldest)


def _size(key: Key, entry: Remembered) -> int:
    """What an entry holds, roughly: the pod as sent and its patches (the plan is of their order)."""
    return len(key[0]) + sum(len(p) for p in entry.patches.values())

