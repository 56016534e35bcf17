"""TensorFusionWorkload reconciler: the status of a dynamic workload (no `spec.replicas`: its workers
are the pods the webhook made workers of it) says how many workers it has and whether they are ready.

- workerCount: worker pods labelled `tensor-fusion.ai/workload=<name>` in its namespace, not being
  deleted; readyWorkers: those Running with condition Ready=True.
- phase: Failed when a worker failed; Running when it has workers and all are ready; else Pending
  (reason NoWorkers or WaitingForWorkers); condition Ready follows.
- Finalizer: a dynamic workload's cleanup has nothing to wait for, so it goes at once.

Workloads with fixed replicas (`spec.replicas` set) are not touched: creating and scaling their
worker pods comes with remote vGPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfusion.api import annotations as tfa
from tfusion.controller.reconcilers.common import (
    FAILED,
    FINALIZER,
    PENDING,
    RUNNING,
    Obj,
    condition,
    labels_of,
    merge_conditions,
    meta,
    status_of,
    write_status,
)
from tfusion.controller.role import component_selector
from tfusion.kube import resources as r
from tfusion.kube.reconciler import Result, ensure_finalizer

if TYPE_CHECKING:
    from tfusion.controller.role import ControllerRuntime

WORKLOAD_INDEX = "workload"


def workload_key(pod: Obj) -> list[str]:
    """"namespace/name" of the workload a worker pod belongs to (the pod index and the watch map)."""
    name = labels_of(pod).get(tfa.WORKLOAD)
    if not name or labels_of(pod).get(tfa.COMPONENT) != tfa.COMPONENT_WORKER:
        return []
    return [f"{meta(pod).get('namespace')}/{name}"]


def is_ready(pod: Obj) -> bool:
    status = status_of(pod)
    return status.get("phase") == RUNNING and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def is_dynamic(workload: Obj) -> bool:
    return (workload.get("spec") or {}).get("replicas") is None


class WorkloadReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.runtime = runtime
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.pods = runtime.informer(r.PODS)
        self.pods.add_index(WORKLOAD_INDEX, workload_key)
        self.controller = runtime.manager.controller("tensorfusionworkload").for_(r.TENSORFUSIONWORKLOADS) \
            .watches(r.PODS, workload_key, label_selector=component_selector(runtime.settings)).complete(self)

    async def reconcile(self, key: str) -> Result | None:
        workload = self.workloads.get(key)
        if workload is None or not is_dynamic(workload):
            return None
        current = await ensure_finalizer(self.runtime.client, r.TENSORFUSIONWORKLOADS, workload, FINALIZER,
                                         self._cleanup)
        if current is None:
            return None
        workers = [p for p in self.pods.by_index(WORKLOAD_INDEX, key) if not meta(p).get("deletionTimestamp")]
        ready = sum(1 for p in workers if is_ready(p))
        failed = sum(1 for p in workers if status_of(p).get("phase") == FAILED)
        if failed:
            phase, reason, message = FAILED, "WorkerFailed", f"{failed} of {len(workers)} worker(s) failed"
        elif not workers:
            phase, reason, message = PENDING, "NoWorkers", "no worker pod yet"
        elif ready == len(workers):
            phase, reason, message = RUNNING, "WorkersReady", f"{ready} worker(s) ready"
        else:
            phase, reason, message = PENDING, "WaitingForWorkers", f"{ready} of {len(workers)} worker(s) ready"
        old = status_of(current)
        wanted: dict[str, Any] = {
            "workerCount": len(workers), "readyWorkers": ready, "phase": phase,
            "conditions": merge_conditions(old.get("conditions"), [condition(
                old.get("conditions"), "Ready", phase == RUNNING, reason, message,
                generation=int(meta(current).get("generation") or 0))]),
        }
        await write_status(self.runtime.client, r.TENSORFUSIONWORKLOADS, current, wanted)
        return None

    async def _cleanup(self, workload: Obj) -> bool:
        return True
