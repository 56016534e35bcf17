"""The controller's reconcilers, one module per kind, each a leader-only, level-triggered loop on
the Manager's builder (tfusion/kube/reconciler.py):

- cluster.py   TensorFusionCluster -> its GPUPools; cluster status from the pools
- pool.py      GPUPool: Node labels; pool status from its GPUNodes
- node.py      Node -> GPUNode (AutoSelect)
- gpunode.py   GPUNode phase from its hypervisor's reports; capacity from its GPUs and the ledger
- pod.py       the one release path (GPUs, index, host port) and the worker finalizer,
               pending-owned-workload; client pods: their TensorFusionConnection
- workload.py  TensorFusionWorkload: fixed-replica worker pods (workers.py builds them), status
- connection.py TensorFusionConnection (remote vGPU): a worker per connection, status with its URL
- gpu_status.py   the allocator's GPU status write-back (attached by the AllocatorService)
- quota_status.py the allocator's GPUResourceQuota status write-back and its alert events (ditto)
- holdings.py  what a worker pod holds: the live-worker rule, its gpu-ids read as a request
- drift.py     the periodic drift audit (leader-only runnable), with repair

`register_reconcilers(runtime, service, assignments)` attaches them all; `configure()` hands it the
allocator service and the index allocator, which several of them use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.reconcilers.cluster import ClusterReconciler
    from tfusion.controller.reconcilers.connection import ConnectionReconciler
    from tfusion.controller.reconcilers.drift import DriftAudit
    from tfusion.controller.reconcilers.gpunode import GpuNodeReconciler
    from tfusion.controller.reconcilers.node import NodeReconciler
    from tfusion.controller.reconcilers.pod import PodReconciler
    from tfusion.controller.reconcilers.pool import PoolReconciler
    from tfusion.controller.reconcilers.workload import WorkloadReconciler
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.assignments import Assignments


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


def register_reconcilers(runtime: ControllerRuntime, service: AllocatorService,
                         assignments: Assignments) -> Reconcilers:
    """Attach every reconciler and the drift audit to the runtime (after the AllocatorService)."""
    # imported here: the allocator service imports gpu_status.py and quota_status.py, and these
    # import the allocator service
    from tfusion.controller.reconcilers.cluster import ClusterReconciler
    from tfusion.controller.reconcilers.connection import ConnectionReconciler
    from tfusion.controller.reconcilers.drift import DriftAudit
    from tfusion.controller.reconcilers.gpunode import GpuNodeReconciler
    from tfusion.controller.reconcilers.node import NodeReconciler
    from tfusion.controller.reconcilers.pod import PodReconciler
    from tfusion.controller.reconcilers.pool import PoolReconciler
    from tfusion.controller.reconcilers.workload import WorkloadReconciler

    attached = Reconcilers(
        cluster=ClusterReconciler(runtime), pool=PoolReconciler(runtime), node=NodeReconciler(runtime),
        gpunode=GpuNodeReconciler(runtime, service), pod=PodReconciler(runtime, service),
        workload=WorkloadReconciler(runtime, assignments), drift=DriftAudit(runtime, service),
        connection=ConnectionReconciler(runtime, assignments))
    return attached
