"""The hypervisor's own check of the dynamic isolation policy, at the device plugin's Allocate.

Why it exists: the original's hypervisor, run with `--isolation-policy=dynamic`, checks each device
before it hands it to a pod, whatever the scheduler decided (reference upstream-hypervisor.md §4.4):
partitioned is refused; the mode must be shared, soft or hard; shared needs the device free of other
workers; otherwise every other worker on the device must hold the same mode. Nothing is changed when
the check refuses. The controller's allocator applies the same rule when it places pods
(tfusion/allocator/isolation.py); this is the node's last line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tfusion.api import annotations as keys
from tfusion.hypervisor.workers.model import WorkerAllocation, WorkerInfo

_MODES = (keys.ISOLATION_SHARED, keys.ISOLATION_SOFT, keys.ISOLATION_HARD)


def refusal(worker: WorkerInfo, others: Iterable[WorkerInfo]) -> str | None:
    """Why `worker` may not have its devices under the dynamic policy, given the node's other workers; None: it may."""
    who = f"worker {worker.namespace}/{worker.name}"
    mode = worker.isolation
    if mode == keys.ISOLATION_PARTITIONED:
        return f"{who}: partitioned isolation is not allowed under the dynamic isolation policy"
    if mode not in _MODES:
        return f"{who}: isolation mode {mode!r} is not allowed under the dynamic isolation policy (shared, soft, hard)"
    mine = {d.lower() for d in worker.allocated_devices}
    for other in others:
        if other.uid == worker.uid:
            continue
        shared = sorted(mine & {d.lower() for d in other.allocated_devices})
        if not shared:
            continue
        if mode == keys.ISOLATION_SHARED:
            return f"{who}: shared isolation needs device {shared[0]} free, but {other.namespace}/{other.name} holds it"
        if other.isolation != mode:
            return (f"{who}: device {shared[0]} runs {other.isolation} isolation ({other.namespace}/{other.name}) "
                    f"under the dynamic isolation policy; the pod asks {mode}")
    return None


def checker(allocations: Callable[[], Iterable[WorkerAllocation]]) -> Callable[[WorkerInfo], str | None]:
    """The Allocate check over the node's current worker allocations (KubernetesWorkers.allocations)."""
    def check(worker: WorkerInfo) -> str | None:
        return refusal(worker, (a.worker for a in allocations()))
    return check
