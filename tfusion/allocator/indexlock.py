"""The node-level pod index lock: no two pods holding GPUs on one node share a device-plugin index.

Why: the hypervisor's device plugin learns which pod a container belongs to from the index
resource the container asks for (`<domain>/index_<k>`, pod index 8k + count, 1..128). The webhook
hands indices out cluster-wide and they repeat once more than 128 pods live, so two pods on one
node could ask for the same one, and the device plugin would give one pod's GPUs to the other.
The allocator therefore holds, per node, which pods hold which index, for as long as their
allocation lives (reserved, committed, restored from a bound pod at leader recovery), and refuses
a reservation whose index another pod holds on that node.

Pure bookkeeping, no I/O: the GpuAllocator calls `occupy` when an allocation starts and `release`
when it ends (rollback, expiry, the pod deleted or finished), so the lock follows the allocation's
life exactly and is rebuilt with it. A pod restored from the cluster is recorded even when its
index is already held there (the pods run; refusing them would only hide the conflict), so an
index is free again only when every holder has left.

Speed: past 128 pods with GPUs every index is held on many nodes, and Filter asks for the nodes
busy for a new pod's index once per pod. A pod that holds no index yet (every new pod) is no
obstacle to itself, so the answer is then the held nodes as they stand, without a pass over them:
the lock counts how many (node, index) places each pod holds to know that in one lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

_NONE: Mapping[str, Set[str]] = {}
_NO_NODES: Set[str] = frozenset()


class NodeIndexLock:
    """index -> node -> the pod UIDs holding that index there."""

    __slots__ = ("_held", "_places")

    def __init__(self) -> None:
        self._held: dict[int, dict[str, set[str]]] = {}
        self._places: dict[str, int] = {}  # pod UID -> how many (node, index) places it holds

    def occupy(self, node: str, index: int, uid: str) -> None:
        if not index:
            return
        holders = self._held.setdefault(index, {}).setdefault(node, set())
        if uid not in holders:
            holders.add(uid)
            self._places[uid] = self._places.get(uid, 0) + 1

    def release(self, node: str, index: int, uid: str) -> None:
        by_node = self._held.get(index)
        if not by_node:
            return
        holders = by_node.get(node)
        if holders is None:
            return
        if uid in holders:
            holders.discard(uid)
            left = self._places[uid] - 1
            if left:
                self._places[uid] = left
            else:
                del self._places[uid]
        if not holders:
            del by_node[node]
            if not by_node:
                del self._held[index]

    def nodes_holding(self, index: int) -> Mapping[str, Set[str]]:
        """node -> holders of `index` (the nodes where a pod with that index cannot go); read only."""
        return self._held.get(index, _NONE) if index else _NONE

    def busy_nodes(self, index: int, besides: str = "") -> Set[str]:
        """The nodes where a pod other than `besides` holds `index` (where a pod with that index
        cannot go; the pod itself, bound or reserved already, is no obstacle to itself)."""
        by_node = self._held.get(index) if index else None
        if not by_node:
            return _NO_NODES
        if not besides or besides not in self._places:  # the pod holds nothing: every holder is another
            return by_node.keys()
        return {node for node, uids in by_node.items() if any(uid != besides for uid in uids)}

    def holders(self, node: str, index: int, *, besides: str = "") -> frozenset[str]:
        """The pods holding `index` on `node`, other than `besides`."""
        found = self.nodes_holding(index).get(node)
        if not found:
            return frozenset()
        return frozenset(found - {besides}) if besides else frozenset(found)

    def conflicts(self) -> list[tuple[str, int, tuple[str, ...]]]:
        """(node, index, holders) wherever more than one pod holds one index (restored from the cluster)."""
        return sorted((node, index, tuple(sorted(uids))) for index, by_node in self._held.items()
                      for node, uids in by_node.items() if len(uids) > 1)

    def snapshot(self) -> dict[str, dict[int, tuple[str, ...]]]:
        """node -> index -> holders, sorted (tests and views)."""
        out: dict[str, dict[int, tuple[str, ...]]] = {}
        for index, by_node in self._held.items():
            for node, uids in by_node.items():
                out.setdefault(node, {})[index] = tuple(sorted(uids))
        return {n: dict(sorted(v.items())) for n, v in sorted(out.items())}
