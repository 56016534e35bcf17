"""`GET /api/allocation`: the allocator's state as the original's diagnostic JSON.

Pure: `build(allocator)` returns `{gpuStore, nodeWorkerStore, allocation, gpuToWorkerMap}`:
- gpuStore: GPU name -> a GPU object (metadata and status: capacity, available, runningApps ...);
- nodeWorkerStore: node -> {"<namespace>/<pod>": true};
- allocation: pod UID -> the allocation request with the original's Go field names (PoolName,
  Request, Limit, GPUNames, PodMeta{name, namespace, uid}, ...);
- gpuToWorkerMap: GPU name -> [{request, limit, podName, podUID, namespace}].
Committed allocations only, as the original (assumed reservations are scheduler-internal).
Fixed on purpose: upstream keyed gpuStore by `NamespacedName.String()`, i.e. "/<name>" for these
cluster-scoped objects; here every GPU key is the plain GPU name, as in gpuToWorkerMap.
"""

from __future__ import annotations

from typing import Any

from tfusion.allocator import GpuAllocator
from tfusion.allocator.allocator import resource_json
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa


def _gpu_object(allocator: GpuAllocator, name: str) -> dict[str, Any]:
    info = allocator.gpu_info(name)
    status = allocator.gpu_status(name)
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPU",
        "metadata": {"name": name, "labels": {tfa.GPU_POOL: info.pool, tfa.MANAGED_BY: info.node}},
        "status": {
            "phase": info.phase,
            "gpuModel": info.model,
            "vendor": info.vendor,
            "usedBy": info.used_by,
            "index": info.index,
            "numaNode": info.numa,
            "isolationMode": info.isolation_mode or "soft",
            "nodeSelector": {tfa.HOSTNAME_LABEL: info.node},
            "capacity": {"tflops": tflops_str(info.capacity_tflops), "vram": vram_str(info.capacity_vram)},
            "available": status["available"],
            "runningApps": status["runningApps"],
        },
    }


def build(allocator: GpuAllocator) -> dict[str, Any]:
    """The `/api/allocation` response body."""
    allocations = allocator.allocations(committed_only=True)
    gpu_store = {name: _gpu_object(allocator, name) for name in allocator.gpu_names()}
    node_workers: dict[str, dict[str, bool]] = {}
    allocation: dict[str, Any] = {}
    gpu_to_worker: dict[str, list[dict[str, Any]]] = {}
    for uid, info in allocations.items():
        req = info.request
        node_workers.setdefault(info.node, {})[f"{req.namespace}/{req.pod_name}"] = True
        allocation[uid] = {
            "PoolName": req.pool,
            "WorkloadNameNamespace": {"name": req.workload[1], "namespace": req.workload[0]},
            "Request": resource_json(req.request),
            "Limit": resource_json(req.limit),
            "GPUIndices": list(req.indices) or None,
            "Count": req.count,
            "GPUModel": req.gpu_model,
            "GPUVendor": req.vendor,
            "NodeAffinity": None,
            "GPUNames": list(info.gpu_names),
            "PodMeta": {"name": req.pod_name, "namespace": req.namespace, "uid": uid},
            "QoS": req.qos,
            "Isolation": req.isolation,
            "PartitionTemplateID": req.partition_template,
        }
        for gpu in info.gpu_names:
            gpu_to_worker.setdefault(gpu, []).append({
                "request": resource_json(req.request), "limit": resource_json(req.limit),
                "podName": req.pod_name, "podUID": uid, "namespace": req.namespace,
            })
    return {
        "gpuStore": gpu_store,
        "nodeWorkerStore": {n: dict(sorted(w.items())) for n, w in sorted(node_workers.items())},
        "allocation": allocation,
        "gpuToWorkerMap": dict(sorted(gpu_to_worker.items())),
    }
