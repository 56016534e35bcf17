"""Which informer updates can make a parked pod fit (kube-scheduler's queueing hints).

Why it exists: every update of a Node (heartbeats) or a GPU (metrics) moving every parked pod back
to the active queue would turn the scheduling queue into a busy loop. The scheduler moves pods only
when an update changes what a check reads or adds room; these predicates say which.
"""

from __future__ import annotations

from typing import Any

from tfusion.api.accessors import Gpu, Node
from tfusion.api.quantity import Quantity, QuantityError


def node_changed(old: Node | None, new: Node) -> bool:
    """A new node, or a change of what a node check reads (labels, spec, allocatable, readiness)."""
    return old is None or _node_signature(old) != _node_signature(new)


def gpu_grew(old: Gpu | None, new: Gpu) -> bool:
    """A new GPU, or more room on one: available or capacity grew, or its phase changed."""
    if old is None or old.phase != new.phase:
        return True
    for before, after in ((old.available, new.available), (old.capacity, new.capacity)):
        if any(_amount(after.get(k)) > _amount(before.get(k)) for k in ("tflops", "vram")):
            return True
    return False


def _node_signature(node: Node) -> tuple[Any, ...]:
    return (node.meta.labels, node.spec, node.allocatable, node.ready)


def _amount(value: Any) -> int:
    try:
        return Quantity.parse(value).milli_value() if value is not None else 0
    except QuantityError:
        return 0
