"""`GET /api/v1/usage`: every worker's current per-GPU usage, for the controller's autoscaler.

Why: the autoscaler's default usage source (`tfusion/controller/autoscaler/sources.py`, "hypervisor")
reads each node's hypervisor directly, so `--role=all` needs no time-series database. The rows come
from the same samples as the `tf_worker_usage` points and the `tfusion_worker_*` gauges
(`worker_samples` over the device registry's last process sample), so every source sees one truth;
they are as fresh as that sample (`--metrics-interval`, or the soft limiter's tick when it runs).
The body Struct lives in `tfusion.metrics.usage`, which the controller may import too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from litestar import get

from tfusion.hypervisor.metrics import worker_samples
from tfusion.metrics.usage import WorkerGpuUsage, WorkerUsageList

if TYPE_CHECKING:
    from tfusion.hypervisor.http import HypervisorContext


def current_usage(ctx: HypervisorContext) -> WorkerUsageList:
    """The rows of `tf_worker_usage` now; the workload is the worker's own (empty when it has none),
    not the table's "unknown" placeholder."""
    node = ctx.settings.resolved_node_name
    rows = []
    workloads = {a.worker.uid: a.worker.workload_name or "" for a in ctx.workers.allocations()}
    for point in worker_samples(ctx.registry, ctx.workers, node, lambda _uuid: ""):
        uid = str(point.tags["worker"])
        rows.append(WorkerGpuUsage(
            namespace=str(point.tags["namespace"]), pod=str(point.tags["pod_name"]), worker=uid,
            workload=workloads.get(uid, ""), gpu=str(point.tags["uuid"]),
            compute_tflops=round(float(point.fields["compute_tflops"]), 3),  # no float noise on the wire
            memory_bytes=int(point.fields["memory_bytes"])))
    return WorkerUsageList(node=node, at=time.time(), data=rows)


def usage_handlers(ctx: HypervisorContext) -> list[Any]:
    @get("/api/v1/usage", sync_to_thread=False,
         summary="Every worker's current use of each of its GPUs (the tf_worker_usage rows)")
    def usage() -> WorkerUsageList:
        return current_usage(ctx)

    return [usage]
