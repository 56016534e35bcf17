"""The controller's reconcilers, one module per kind, each a leader-only, level-triggered loop on
the Manager's builder (tfusion/kube/reconciler.py):

- cluster.py   TensorFusionCluster -> its GPUPools; cluster status from the pools
- pool.py      GPUPool: Node labels; pool status from its GPUNodes
- node.py      Node -> GPUNode (AutoSelect)
- gpunode.py   GPUNode phase from its hypervisor's reports; capacity from its GPUs and the ledger
- pod.py       worker pods: finalizer, release exactly once, pending-owned-workload; client pods:
               their TensorFusionConnection
- workload.py  TensorFusionWorkload: fixed-replica worker pods (workers.py builds them), status
- connection.py TensorFusionConnection (remote vGPU): a worker per connection, status with its URL
- quota.py     GPUResourceQuota alert events (the status is the allocator's quota-status reconciler's)
- drift.py     the periodic drift audit (leader-only runnable), with repair

`register_reconcilers(runtime)` attaches them all; `configure()` calls it after the allocator
service, which several of them read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfusion.controller.reconcilers.cluster import ClusterReconciler
    from tfusion.controller.reconcilers.connection import ConnectionReconciler
    from tfusion.controller.reconcilers.drift import DriftAudit
    from tfusion.controller.reconcilers.gpunode import GpuNodeReconciler
    from tfusion.controller.reconcilers.node import NodeReconciler
    from tfusion.controller.reconcilers.pod import PodReconciler
    from tfusion.controller.reconcilers.pool import PoolReconciler
    from tfusion.controller.reconcilers.workload import WorkloadReconciler
    from tfusion.controller.role import ControllerRuntime


@dataclass(frozen=True)
class Reconcilers:
    """What `register_reconcilers` attached (tests and the lead's wiring reach them here)."""

    cluster: ClusterReconciler
    pool: PoolReconciler
    node: NodeReconciler
    gpunode: GpuNodeReconciler
    pod: PodReconciler
    workload: WorkloadReconciler
    drift: DriftAudit
    connection: ConnectionReconciler | None = None


def register_reconcilers(runtime: ControllerRuntime) -> Reconcilers:
    """Attach every reconciler and the drift audit to the runtime (after the AllocatorService)."""
    # imported here: the allocator service imports quota.py, and these import the allocator service
    from tfusion.controller.reconcilers.cluster import ClusterReconciler
    from tfusion.controller.reconcilers.connection import ConnectionReconciler
    from tfusion.controller.reconcilers.drift import DriftAudit
    from tfusion.controller.reconcilers.gpunode import GpuNodeReconciler
    from tfusion.controller.reconcilers.node import NodeReconciler
    from tfusion.controller.reconcilers.pod import PodReconciler
    from tfusion.controller.reconcilers.pool import PoolReconciler
    from tfusion.controller.reconcilers.workload import WorkloadReconciler

    service = runtime.allocation
    if service is None:
        raise RuntimeError("register_reconcilers needs the AllocatorService attached first")
    attached = Reconcilers(
        cluster=ClusterReconciler(runtime), pool=PoolReconciler(runtime), node=NodeReconciler(runtime),
        gpunode=GpuNodeReconciler(runtime), pod=PodReconciler(runtime), workload=WorkloadReconciler(runtime),
        drift=DriftAudit(runtime, service), connection=ConnectionReconciler(runtime))
    if runtime.assignments is not None:  # a worker's index and host port go with its GPUs
        attached.pod.release_hooks.append(runtime.assignments.release_pod)
    runtime.reconcilers = attached
    return attached
