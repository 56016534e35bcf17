"""JSON views of the allocator's state: GPU and quota status, and `GET /api/allocation`.

Why it exists: the allocator is pure bookkeeping in integers (milli-TFLOPS, bytes); every JSON shape
the controller writes or serves is built here from its typed data, so that a change of wire format
never touches the allocator, and the status writers, `/api/allocation` and the GPUNode reconciler
render the same thing the same way.

- `gpu_status(allocator, name)`: a GPU's `status.available` and `status.runningApps` (committed
  allocations only, grouped by workload, pods sorted by name then uid), and under the dynamic
  isolation policy `activeIsolationMode`/`dynamicIsolationConflict`.
- `quota_status(allocator, namespace)` / `quota_status_of(spec, used)`: a GPUResourceQuota's
  `status.used`, `availablePercent` and Ready condition (without timestamps: the writer knows the clock).
- `build(allocator, gpu_object=..., pod_object=...)`: the `/api/allocation` body
  `{gpuStore, nodeWorkerStore, allocation, gpuToWorkerMap}`:
  - gpuStore: GPU name -> the whole GPU object (metadata and every status field the hypervisor
    reported: uuid, message, isolationPolicy, model, topology, nvLink, ...) with the allocator's live
    `status.available` and `status.runningApps` laid over it. The allocator keeps no objects, so the
    caller passes `gpu_object` (GPU name -> cached object); a GPU the cache lacks is described from
    what the allocator knows;
  - nodeWorkerStore: node -> {"<namespace>/<pod>": true};
  - allocation: pod UID -> the allocation request with the original's Go field names (PoolName,
    Request, Limit, GPUNames, PodMeta, ...). PodMeta keeps what the original keeps of the pod's
    metadata (name, namespace, uid, resourceVersion, generation, labels, annotations,
    ownerReferences), taken from `pod_object` ((namespace, name) -> cached pod) when the cached pod is
    the allocated one (same uid);
  - gpuToWorkerMap: GPU name -> [{request, limit, podName, podUID, namespace}].
  Every Resource there carries `tflops`, `compute` and `vram`, as the original's struct always does.
  Committed allocations only, as the original (assumed reservations are scheduler-internal).
  Fixed on purpose: upstream keyed gpuStore by `NamespacedName.String()`, i.e. "/<name>" for these
  cluster-scoped objects; here every GPU key is the plain GPU name, as in gpuToWorkerMap.
"""


from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NotRequired, TypeAlias, TypedDict

from tfusion.allocator import AllocationInfo, GpuAllocator, QuotaSpec, Resources, Usage, isolation
from tfusion.allocator.partitions import Partition
from tfusion.allocator.quota import READY_MESSAGE
from tfusion.allocator.units import percent_str, ratio_str, tflops_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Pod
from tfusion.api.jsontypes import JsonMapping, JsonObject, JsonValue, json_copy, json_object
from tfusion.controller.reconcilers.common import ConditionState

#: GPU name -> the cached GPU object (read only: it is the informer's)
GpuLookup: TypeAlias = "Callable[[str], JsonMapping | None]"
#: (namespace, name) -> the cached pod (read only)
PodLookup: TypeAlias = "Callable[[str, str], JsonMapping | None]"

#: the pod metadata fields the original keeps in PodMeta
POD_META_FIELDS = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations",
                   "ownerReferences")


class AppPod(TypedDict):
    """A pod in a GPU's `status.runningApps[].pods`."""
    name: str
    namespace: str
    uid: str
    requests: dict[str, str]
    limits: dict[str, str]
    qos: str


class RunningApp(TypedDict):
    """A workload in a GPU's `status.runningApps`, with its pods on that GPU."""
    name: str
    namespace: str
    count: int
    pods: list[AppPod]


class PartitionStatus(TypedDict):
    """A GPU's `status.allocatedPartitions[podUID]` (AllocatedPartition): the slice a pod holds."""
    templateId: str
    podUid: str
    podName: str
    namespace: str
    allocatedAt: str
    allocatedSlotStart: NotRequired[int]
    allocatedSlotEnd: NotRequired[int]
    isolationGroupId: NotRequired[int]


class GpuLiveStatus(TypedDict):
    """The part of a GPU's status the allocator's ledger says; `allocatedPartitions` only while it
    holds partitions. Under the dynamic isolation policy also the active mode (None: no mode, the
    field is removed) and the conflict flag."""
    available: dict[str, str]
    runningApps: list[RunningApp]
    allocatedPartitions: NotRequired[dict[str, PartitionStatus]]
    activeIsolationMode: NotRequired[str | None]
    dynamicIsolationConflict: NotRequired[bool]


class QuotaUsed(TypedDict):
    requests: dict[str, str]
    limits: dict[str, str]
    workers: int


class QuotaStatus(TypedDict):
    """A GPUResourceQuota's status as the ledger says it (its writer stamps the times)."""
    used: QuotaUsed
    availablePercent: dict[str, str]
    conditions: list[ConditionState]


def resource_view(res: Resources) -> dict[str, str]:
    """A Resource as the original serialises it: all three quantities, zero included."""
    return {"tflops": tflops_str(res.tflops), "compute": percent_str(res.percent), "vram": vram_str(res.vram)}


def status_resource(res: Resources) -> dict[str, str]:
    """A Resource in a GPU's runningApps: tflops and vram, and compute only for a percent-only request."""
    out = {"tflops": tflops_str(res.tflops), "vram": vram_str(res.vram)}
    if res.percent and not res.tflops:
        out["compute"] = percent_str(res.percent)
    return out


def gpu_status(allocator: GpuAllocator, name: str, previous: object = None, now: str = "") -> GpuLiveStatus:
    """`status.available`, `status.runningApps` and `status.allocatedPartitions` of a GPU (committed
    allocations only). A partition's `allocatedAt` is the one `previous` (the GPU's current
    allocatedPartitions) records for the same pod and template, else `now`."""
    avail_t, avail_v = allocator.available(name, committed_only=True)
    apps: dict[tuple[str, str], list[AppPod]] = {}
    parts: dict[str, PartitionStatus] = {}
    for info in allocator.gpu_allocations(name):
        if info.partitions:
            part = info.partitions[info.gpu_names.index(name)]
            if part is not None:
                parts[info.request.pod_uid] = partition_status(info, part, previous, now)
        req = info.request
        apps.setdefault(req.workload, []).append({
            "name": req.pod_name, "namespace": req.namespace, "uid": req.pod_uid,
            "requests": status_resource(req.request), "limits": status_resource(req.limit), "qos": req.qos,
        })
    running: list[RunningApp] = [{"name": wl_name, "namespace": ns, "count": len(pods),
                                  "pods": sorted(pods, key=lambda p: (p["name"], p["uid"]))}
                                 for (ns, wl_name), pods in sorted(apps.items())]
    status: GpuLiveStatus = {"available": {"tflops": tflops_str(avail_t), "vram": vram_str(avail_v)},
                             "runningApps": running}
    if parts:
        status["allocatedPartitions"] = parts
    if allocator.isolation_policy == isolation.DYNAMIC:
        mode, conflict = isolation.committed_mode([a.request for a in allocator.gpu_allocations(name)])
        status["activeIsolationMode"] = mode or None
        status["dynamicIsolationConflict"] = conflict
    return status


def partition_status(info: AllocationInfo, part: Partition, previous: object, now: str) -> PartitionStatus:
    req = info.request
    before = previous.get(req.pod_uid) if isinstance(previous, Mapping) else None
    since = now
    if isinstance(before, Mapping) and before.get("templateId") == part.template_id and before.get("allocatedAt"):
        since = str(before["allocatedAt"])
    entry: PartitionStatus = {"templateId": part.template_id, "podUid": req.pod_uid, "podName": req.pod_name,
                              "namespace": req.namespace, "allocatedAt": since}
    if part.slot_start is not None and part.slot_end is not None:
        entry["allocatedSlotStart"] = part.slot_start
        entry["allocatedSlotEnd"] = part.slot_end
    if part.group is not None:
        entry["isolationGroupId"] = part.group
    return entry


def partitions_match(status: Mapping[str, object], wanted: GpuLiveStatus) -> bool:
    """The GPU status's allocatedPartitions say what `wanted` says, allocation times aside."""
    have = status.get("allocatedPartitions") or {}
    want = wanted.get("allocatedPartitions") or {}
    if not isinstance(have, Mapping) or set(have) != set(want):
        return False
    for uid, entry in want.items():
        seen = have[uid]
        if not isinstance(seen, Mapping) or {k: v for k, v in seen.items() if k != "allocatedAt"} != \
                {k: v for k, v in entry.items() if k != "allocatedAt"}:
            return False
    return True


def quota_status(allocator: GpuAllocator, namespace: str) -> QuotaStatus:
    """status.used, availablePercent and the Ready condition of the namespace's quota."""
    return quota_status_of(allocator.quota_spec(namespace), allocator.quota_usage(namespace))


def quota_status_of(spec: QuotaSpec | None, used: Usage) -> QuotaStatus:
    """status.used, status.availablePercent and status.conditions (Ready) for a quota.

    lastUpdateTime and the conditions' lastTransitionTime are the writer's business (it knows the
    clock and the previous condition); the condition here carries type, status, reason and message.
    """
    spec = spec or QuotaSpec()
    percent = {
        "requests.tflops": ratio_str((spec.requests_tflops or 0) - used.requests_tflops,
                                     spec.requests_tflops or 0),
        "requests.vram": ratio_str((spec.requests_vram or 0) - used.requests_vram, spec.requests_vram or 0),
        "limits.tflops": ratio_str((spec.limits_tflops or 0) - used.limits_tflops, spec.limits_tflops or 0),
        "limits.vram": ratio_str((spec.limits_vram or 0) - used.limits_vram, spec.limits_vram or 0),
        "workers": ratio_str((spec.max_workers or 0) - used.workers, spec.max_workers or 0),
    }
    floor = 100 - spec.alert_threshold_percent
    reached = {key: float(value) < floor for key, value in percent.items()}
    if any(reached.values()):
        message = (
            "One of the following resources has reached alert threshold:"
            f" tflops requests: {str(reached['requests.tflops']).lower()},"
            f" vram requests: {str(reached['requests.vram']).lower()},"
            f" tflops limits: {str(reached['limits.tflops']).lower()},"
            f" vram limits: {str(reached['limits.vram']).lower()},"
            f" workers: {str(reached['workers']).lower()}")
        condition: ConditionState = {"type": "Ready", "status": "False", "reason": "AlertThresholdReached",
                                     "message": message}
    else:
        condition = {"type": "Ready", "status": "True", "reason": "CapacitySufficient", "message": READY_MESSAGE}
    return {
        "used": {
            "requests": {"tflops": tflops_str(used.requests_tflops), "vram": vram_str(used.requests_vram)},
            "limits": {"tflops": tflops_str(used.limits_tflops), "vram": vram_str(used.limits_vram)},
            "workers": used.workers,
        },
        "availablePercent": percent,
        "conditions": [condition],
    }


def _described_gpu(allocator: GpuAllocator, name: str) -> JsonObject:
    """A GPU object from the allocator's own record, for a GPU the caller's cache does not hold."""
    info = allocator.gpu_info(name)
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
            "isolationMode": info.isolation_mode or tfa.DEFAULT_ISOLATION,
            "isolationPolicy": info.isolation_policy,
            "nodeSelector": {tfa.HOSTNAME_LABEL: info.node},
            "capacity": {"tflops": tflops_str(info.capacity_tflops), "vram": vram_str(info.capacity_vram)},
        },
    }


def _gpu_view(allocator: GpuAllocator, name: str, gpu_object: GpuLookup) -> JsonObject:
    cached = gpu_object(name)
    # cached informer objects are shared with every reader: never modify them
    gpu = json_object(cached) if cached is not None else _described_gpu(allocator, name)
    status = gpu.get("status")
    if not isinstance(status, dict):
        status = gpu["status"] = {}
    live = gpu_status(allocator, name, status.get("allocatedPartitions"))  # times: the written status's
    status["available"] = json_object(live["available"])
    status["runningApps"] = [json_object(app) for app in live["runningApps"]]
    if "allocatedPartitions" in live:
        status["allocatedPartitions"] = {uid: json_object(entry) for uid, entry in live["allocatedPartitions"].items()}
    else:
        status.pop("allocatedPartitions", None)
    return gpu


def _pod_meta(info: AllocationInfo, uid: str, pod_object: PodLookup) -> JsonObject:
    req = info.request
    meta: JsonObject = {"name": req.pod_name, "namespace": req.namespace, "uid": uid}
    pod = pod_object(req.namespace, req.pod_name)
    cached = Pod(pod).meta if pod is not None else None
    if cached is None or cached.uid != uid:
        return meta  # not cached, or a newer pod of the same name
    for field in POD_META_FIELDS:
        value = cached.raw.get(field)
        if value not in (None, "", 0, {}, []):
            meta[field] = json_copy(value)
    return meta


def _allocation_view(info: AllocationInfo, uid: str, pod_object: PodLookup) -> JsonObject:
    req = info.request
    return {
        "PoolName": req.pool,
        "WorkloadNameNamespace": {"name": req.workload[1], "namespace": req.workload[0]},
        "Request": {**resource_view(req.request)},
        "Limit": {**resource_view(req.limit)},
        "GPUIndices": [*req.indices] or None,
        "Count": req.count,
        "GPUModel": req.gpu_model,
        "GPUVendor": req.vendor,
        "NodeAffinity": None,
        "GPUNames": [*info.gpu_names],
        "PodMeta": _pod_meta(info, uid, pod_object),
        "QoS": req.qos,
        "Isolation": req.isolation,
        "PartitionTemplateID": req.partition_template,
    }


def build(allocator: GpuAllocator, *, gpu_object: GpuLookup, pod_object: PodLookup) -> JsonObject:
    """The `/api/allocation` response body (see the module docstring for the lookups)."""
    allocations = allocator.allocations(committed_only=True)
    gpu_store: JsonObject = {name: _gpu_view(allocator, name, gpu_object) for name in allocator.gpu_names()}
    node_workers: dict[str, JsonObject] = {}
    allocation: JsonObject = {}
    gpu_to_worker: dict[str, list[JsonValue]] = {}
    for uid, info in allocations.items():
        req = info.request
        node_workers.setdefault(info.node, {})[f"{req.namespace}/{req.pod_name}"] = True
        allocation[uid] = _allocation_view(info, uid, pod_object)
        for gpu in info.gpu_names:
            gpu_to_worker.setdefault(gpu, []).append({
                "request": {**resource_view(req.request)}, "limit": {**resource_view(req.limit)},
                "podName": req.pod_name, "podUID": uid, "namespace": req.namespace,
            })
    return {
        "gpuStore": gpu_store,
        "nodeWorkerStore": {n: dict(sorted(w.items())) for n, w in sorted(node_workers.items())},
        "allocation": allocation,
        "gpuToWorkerMap": dict(sorted(gpu_to_worker.items())),
    }
