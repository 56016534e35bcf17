"""A synthetic tfusion cluster as the console's cache would hold it: every object a page reads.

Why it exists: the console must render every page in well under 300 ms at 1,000 nodes, 4,000 GPUs
and 10,000 pods, and its view models need objects that look like what the controller, hypervisor
and webhook really write. Starting that many simulated nodes is far too slow for a test or a
benchmark, so this module writes the objects directly, consistent with one another the way a
settled cluster is: every bound worker's `gpu-ids` name GPUs on its node, each GPU's `available`
is its capacity less the requests of the pods on it, `runningApps`/`allocatedPods` list exactly
those pods, pools and quotas sum their nodes and namespaces. Keys come from
`tfusion.api.annotations` and the kinds' schemas (tests/unit/test_console_cluster_helper.py checks
the objects against the CRD schemas and the Kubernetes ones).

Deterministic for a given `seed` (and `now`), so a benchmark run compares with the last one.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tfusion.allocator import QuotaSpec, Usage
from tfusion.allocator.units import tflops_str, vram_str
from tfusion.api import annotations as tfa
from tfusion.api.timestamps import rfc3339
from tfusion.controller.views import quota_status_of
from tfusion.kube import resources as r
from tfusion.kube.resources import ApiResource

GIB = 1 << 30
API_VERSION = "tensor-fusion.ai/v1"
OPERATOR = "tensor-fusion-operator"


@dataclass(frozen=True)
class GpuModel:
    name: str
    full_name: str
    tflops_milli: int  # FP16 dense TFLOPS, milli
    vram: int  # bytes
    cost_per_hour: str


#: one model per pool (cycled): FP16 dense figures of the real parts
MODELS = (
    GpuModel("A100", "NVIDIA A100-SXM4-80GB", 312_000, 80 * GIB, "$1.64"),
    GpuModel("H100", "NVIDIA H100 80GB HBM3", 989_000, 80 * GIB, "$2.49"),
    GpuModel("L40S", "NVIDIA L40S", 362_000, 48 * GIB, "$0.99"),
    GpuModel("A10", "NVIDIA A10", 125_000, 24 * GIB, "$0.60"),
)
#: the share of a GPU one worker requests, and how much its limit may go above
REQUEST_FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.25)
LIMIT_FACTORS = (1.0, 1.5, 2.0)
#: every this many nodes, one is NotReady (a kubelet that stopped posting status)
NOT_READY_EVERY = 97
#: every this many workloads, one asks for two GPUs per worker
MULTI_GPU_EVERY = 10
PODS_PER_WORKLOAD = 10
#: every this many namespaces, one has used nearly all its quota
QUOTA_TIGHT_EVERY = 4
APPS = ("llm-serve", "embed", "train", "notebook", "rerank", "whisper", "sdxl", "batch-infer")


@dataclass
class _Gpu:
    name: str
    node: str
    pool: str
    model: GpuModel
    index: int
    free_tflops: int
    free_vram: int
    pods: list[dict[str, Any]] = field(default_factory=list)  # PodGPUInfo + workload


@dataclass(frozen=True)
class _Workload:
    name: str
    namespace: str
    pool: int
    qos: str
    gpu_count: int
    request_fraction: float
    limit_factor: float
    replicas: int


def synthetic_cluster(nodes: int = 1000, gpus_per_node: int = 4, pods: int = 10000, pending: int = 50,
                      namespaces: int = 20, pools: int = 4, *, seed: int = 0,
                      now: float | None = None) -> dict[ApiResource, list[dict[str, Any]]]:
    """Objects for every resource the console reads (`tfusion.console.cache.RESOURCES`).

    `pods` bound worker pods (a pod that finds no room is left out, so the count can fall short
    only when the GPUs are nearly full: at the defaults every pod fits), plus `pending` pods the
    scheduler marked PodScheduled=False; events from the operator on both kinds.
    """
    for name, value, least in (("nodes", nodes, 1), ("gpus_per_node", gpus_per_node, 1), ("pods", pods, 0),
                               ("pending", pending, 0), ("namespaces", namespaces, 1), ("pools", pools, 1)):
        if value < least:
            raise ValueError(f"synthetic_cluster: {name}={value} is not allowed; expected at least {least}")
    if pools > nodes:
        raise ValueError(f"synthetic_cluster: pools={pools} is not allowed; expected at most nodes ({nodes})")
    rng = random.Random(seed)
    clock = time.time() if now is None else now
    pool_names = [f"pool-{MODELS[i % len(MODELS)].name.lower()}-{i}" for i in range(pools)]
    ns_names = [f"team-{i:02d}" for i in range(namespaces)]
    node_objs, gpus_by_pool = _nodes_and_gpus(nodes, gpus_per_node, pool_names, clock)
    workloads = _workloads(pods, namespaces=ns_names, pools=len(pool_names), rng=rng)
    used = {ns: Usage() for ns in ns_names}
    bound = _place(workloads, gpus_by_pool, pool_names, pods, gpus_per_node, rng, clock, used)
    waiting = _pending_pods(pending, workloads, pool_names, gpus_by_pool, rng, clock)
    all_gpus = [gpu for pool in gpus_by_pool for gpu in pool]
    ready = {n["metadata"]["name"]: _is_ready(n) for n in node_objs}
    workers = Counter((p["metadata"]["namespace"], p["metadata"]["labels"][tfa.WORKLOAD]) for p in bound)
    return _versioned({
        r.NODES: node_objs,
        r.GPUS: [_gpu_object(gpu) for gpu in all_gpus],
        r.GPUNODES: _gpunodes(all_gpus, ready, clock),
        r.GPUPOOLS: _pools(pool_names, gpus_by_pool, ready),
        r.PODS: bound + waiting,
        r.TENSORFUSIONWORKLOADS: [_workload_object(w, pool_names, workers[(w.namespace, w.name)], clock)
                                  for w in workloads],
        r.GPURESOURCEQUOTAS: _quotas(used, clock),
        r.EVENTS: _events(bound, waiting, clock),
        r.PROVIDERCONFIGS: [_provider_config()],
    })


def _versioned(objects: dict[ApiResource, list[dict[str, Any]]]) -> dict[ApiResource, list[dict[str, Any]]]:
    """Every object gets a resourceVersion, as one read from an API server has."""
    version = 0
    for found in objects.values():
        for obj in found:
            version += 1
            obj["metadata"].setdefault("resourceVersion", str(version))
    return objects


def _nodes_and_gpus(nodes: int, gpus_per_node: int, pool_names: list[str],
                    clock: float) -> tuple[list[dict[str, Any]], list[list[_Gpu]]]:
    node_objs: list[dict[str, Any]] = []
    gpus_by_pool: list[list[_Gpu]] = [[] for _ in pool_names]
    for i in range(nodes):
        pool = i % len(pool_names)
        model = MODELS[pool % len(MODELS)]
        name = f"gpu-node-{i:04d}"
        node_objs.append(_node(name, model, gpus_per_node, ready=(i + 1) % NOT_READY_EVERY != 0, clock=clock))
        for index in range(gpus_per_node):
            gpus_by_pool[pool].append(_Gpu(name=f"gpu-{i:04x}{index:02x}-{_hex(i * 64 + index)}", node=name,
                                           pool=pool_names[pool], model=model, index=index,
                                           free_tflops=model.tflops_milli, free_vram=model.vram))
    return node_objs, gpus_by_pool


def _hex(n: int) -> str:
    """A stable UUID-like tail: GPU objects are named after the device UUID, lowercased."""
    return f"{(n * 2654435761) % (1 << 32):08x}-7c1e-4f0a-9b3d-{n:012x}"


def _node(name: str, model: GpuModel, gpus: int, *, ready: bool, clock: float) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status"} if ready else \
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
         "message": "Kubelet stopped posting node status."}
    stamp = rfc3339(clock - 86400)
    capacity = {"cpu": "96", "memory": "1056462012Ki", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": _uid("node", name), "creationTimestamp": stamp, "labels": {
            tfa.HOSTNAME_LABEL: name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            tfa.NVIDIA_GPU_PRESENT_LABEL: "true", tfa.HARDWARE_VENDOR: "NVIDIA",
            "node.kubernetes.io/instance-type": f"gpu-{model.name.lower()}-{gpus}x"}},
        "spec": {},
        "status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{**condition, "lastHeartbeatTime": rfc3339(clock - 10), "lastTransitionTime": stamp}],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


def _is_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _uid(kind: str, key: str) -> str:
    """A stable UID per object (str hashes change between runs; this does not)."""
    n = zlib.crc32(f"{kind}/{key}".encode()) << 16 | zlib.adler32(f"{key}/{kind}".encode()) & 0xFFFF
    return f"{n % (1 << 32):08x}-0000-4000-8000-{n % (1 << 48):012x}"


def _workloads(pods: int, *, namespaces: list[str], pools: int, rng: random.Random) -> list[_Workload]:
    count = max(1, -(-pods // PODS_PER_WORKLOAD)) if pods else 0
    out: list[_Workload] = []
    left = pods
    for k in range(count):
        replicas = min(PODS_PER_WORKLOAD, left)
        left -= replicas
        out.append(_Workload(
            name=f"{APPS[k % len(APPS)]}-{k:04d}", namespace=namespaces[k % len(namespaces)], pool=k % pools,
            qos=tfa.QOS_LEVELS[rng.randrange(len(tfa.QOS_LEVELS))],
            gpu_count=2 if k % MULTI_GPU_EVERY == MULTI_GPU_EVERY - 1 else 1,
            request_fraction=rng.choice(REQUEST_FRACTIONS), limit_factor=rng.choice(LIMIT_FACTORS),
            replicas=replicas))
    return out


def _amounts(model: GpuModel, w: _Workload) -> tuple[int, int, int, int]:
    """(request TFLOPS milli, request VRAM, limit TFLOPS milli, limit VRAM) per GPU of a worker."""
    tflops = int(model.tflops_milli * w.request_fraction) // 1000 * 1000
    vram = int(model.vram * w.request_fraction) // GIB * GIB
    return (tflops, vram, min(model.tflops_milli, int(tflops * w.limit_factor)),
            min(model.vram, int(vram * w.limit_factor)) // GIB * GIB)


def _place(workloads: list[_Workload], gpus_by_pool: list[list[_Gpu]], pool_names: list[str], pods: int,
           gpus_per_node: int, rng: random.Random, clock: float, used: dict[str, Usage]) -> list[dict[str, Any]]:
    """Bound worker pods, each on GPUs of one node of its workload's pool with room for it; what each
    holds is added to its namespace's quota usage (requests and limits on every GPU, one worker)."""
    cursor = [0] * len(gpus_by_pool)
    out: list[dict[str, Any]] = []
    for w in workloads:
        gpus = gpus_by_pool[w.pool]
        model = gpus[0].model
        req_t, req_v, lim_t, lim_v = _amounts(model, w)
        count = min(w.gpu_count, gpus_per_node)
        for replica in range(w.replicas):
            chosen = _fit(gpus, cursor, w.pool, count, gpus_per_node, req_t, req_v)
            if chosen is None:
                continue
            name = f"{w.name}-{_suffix(rng)}"
            uid = _uid("pod", f"{w.namespace}/{name}")
            info = {"name": name, "namespace": w.namespace, "uid": uid,
                    "requests": {"tflops": tflops_str(req_t), "vram": vram_str(req_v)},
                    "limits": {"tflops": tflops_str(lim_t), "vram": vram_str(lim_v)}, "qos": w.qos}
            for gpu in chosen:
                gpu.free_tflops -= req_t
                gpu.free_vram -= req_v
                gpu.pods.append({**info, "workload": w.name})
            n = len(chosen)
            used[w.namespace].add(Usage(requests_tflops=req_t * n, requests_vram=req_v * n, limits_tflops=lim_t * n,
                                        limits_vram=lim_v * n, workers=1))
            out.append(_worker_pod(w, name, uid, pool_names[w.pool], chosen, (req_t, req_v, lim_t, lim_v),
                                   replica, clock))
            if len(out) == pods:
                return out
    return out


def _fit(gpus: list[_Gpu], cursor: list[int], pool: int, count: int, per_node: int, tflops: int,
         vram: int) -> list[_Gpu] | None:
    """`count` GPUs of one node with room, searching round-robin from the pool's cursor."""
    nodes = len(gpus) // per_node
    for step in range(nodes):
        start = ((cursor[pool] + step) % nodes) * per_node
        roomy = [g for g in gpus[start:start + per_node] if g.free_tflops >= tflops and g.free_vram >= vram]
        if len(roomy) >= count:
            cursor[pool] = (cursor[pool] + step + 1) % nodes
            first = (cursor[pool] * 7) % len(roomy)  # not always GPU 0 of the node
            return [roomy[(first + i) % len(roomy)] for i in range(count)]
    return None


def _suffix(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def _pod_annotations(w: _Workload, pool: str, amounts: tuple[int, int, int, int]) -> dict[str, str]:
    req_t, req_v, lim_t, lim_v = amounts
    return {
        tfa.GPU_POOL: pool, tfa.TFLOPS_REQUEST: tflops_str(req_t), tfa.VRAM_REQUEST: vram_str(req_v),
        tfa.TFLOPS_LIMIT: tflops_str(lim_t), tfa.VRAM_LIMIT: vram_str(lim_v), tfa.QOS: w.qos,
        tfa.GPU_COUNT: tfa.format_gpu_count(w.gpu_count), tfa.IS_LOCAL_GPU: "true",
        tfa.ISOLATION: tfa.DEFAULT_ISOLATION, tfa.INJECT_CONTAINER: "main", tfa.EMBEDDED_WORKER: "true",
    }


def _pod_labels(w: _Workload, pool: str) -> dict[str, str]:
    return {"app": w.name, tfa.ENABLED: "true", tfa.COMPONENT: tfa.COMPONENT_WORKER, tfa.GPU_POOL: pool,
            tfa.WORKLOAD: w.name}


def _pod(w: _Workload, name: str, uid: str, pool: str, amounts: tuple[int, int, int, int],
         created: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": w.namespace, "uid": uid, "creationTimestamp": rfc3339(created),
            "labels": _pod_labels(w, pool), "annotations": _pod_annotations(w, pool, amounts),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{w.name}-6d5f8c",
                                 "uid": _uid("rs", f"{w.namespace}/{w.name}"), "controller": True,
                                 "blockOwnerDeletion": True}]},
        "spec": {
            "schedulerName": tfa.SCHEDULER_NAME, "restartPolicy": "Always",
            "containers": [{"name": "main", "image": f"registry.example.com/{w.name.rsplit('-', 1)[0]}:1.4",
                            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}],
        },
    }


def _worker_pod(w: _Workload, name: str, uid: str, pool: str, gpus: list[_Gpu],
                amounts: tuple[int, int, int, int], replica: int, clock: float) -> dict[str, Any]:
    created = clock - 3600 - replica * 60
    pod = _pod(w, name, uid, pool, amounts, created)
    pod["metadata"]["annotations"][tfa.GPU_IDS] = tfa.format_gpu_ids(g.name for g in gpus)
    pod["metadata"]["annotations"][tfa.CONTAINER_GPUS] = tfa.format_container_gpus({"main": [g.name for g in gpus]})
    pod["metadata"]["finalizers"] = [tfa.FINALIZER]
    pod["spec"]["nodeName"] = gpus[0].node
    started = rfc3339(created + 5)
    pod["status"] = {
        "phase": "Running", "podIP": f"10.{zlib.crc32(name.encode()) % 250}.{replica % 250}.{len(gpus) + 1}",
        "startTime": started, "qosClass": "Burstable",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                       for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                               "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                               "containerID": f"containerd://{uid.replace('-', '')}",
                               "state": {"running": {"startedAt": started}}, "lastState": {}}],
    }
    return pod


def _pending_pods(pending: int, workloads: list[_Workload], pool_names: list[str], gpus_by_pool: list[list[_Gpu]],
                  rng: random.Random, clock: float) -> list[dict[str, Any]]:
    """Pods the scheduler could not place: half too big for any GPU of the pool, half for want of room."""
    out: list[dict[str, Any]] = []
    nodes = len({g.node for pool in gpus_by_pool for g in pool})
    for i in range(pending):
        base = workloads[i % len(workloads)] if workloads else None
        namespace = base.namespace if base else "default"
        pool = base.pool if base else 0
        model = MODELS[pool % len(MODELS)]
        impossible = i % 2 == 0
        w = _Workload(name=f"waiting-{i:03d}", namespace=namespace, pool=pool,
                      qos=tfa.QOS_LEVELS[i % len(tfa.QOS_LEVELS)], gpu_count=1,
                      request_fraction=1.5 if impossible else 1.0, limit_factor=1.0, replicas=1)
        req_t = int(model.tflops_milli * w.request_fraction) // 1000 * 1000
        req_v = int(model.vram * w.request_fraction) // GIB * GIB
        name = f"{w.name}-{_suffix(rng)}"
        pod = _pod(w, name, _uid("pod", f"{namespace}/{name}"), pool_names[pool], (req_t, req_v, req_t, req_v),
                   clock - 600 - i)
        what = "GPU VRAM too small" if impossible else "GPU TFLOPS insufficient"
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
            "lastTransitionTime": rfc3339(clock - 590 - i),
            "message": f"0/{nodes} nodes are available: {nodes // len(pool_names)} {what}."}]}
        out.append(pod)
    return out


def _gpu_object(gpu: _Gpu) -> dict[str, Any]:
    apps: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for info in gpu.pods:
        apps[(info["namespace"], info["workload"])].append({k: v for k, v in info.items() if k != "workload"})
    return {
        "apiVersion": API_VERSION, "kind": "GPU",
        "metadata": {"name": gpu.name, "labels": {tfa.GPU_POOL: gpu.pool, tfa.MANAGED_BY: gpu.node}},
        "status": {
            "capacity": {"tflops": tflops_str(gpu.model.tflops_milli), "vram": vram_str(gpu.model.vram)},
            "available": {"tflops": tflops_str(gpu.free_tflops), "vram": vram_str(gpu.free_vram)},
            "uuid": gpu.name.upper(), "nodeSelector": {tfa.HOSTNAME_LABEL: gpu.node},
            "gpuModel": gpu.model.name, "model": gpu.model.full_name, "message": "", "phase": "Running",
            "vendor": "NVIDIA", "isolationMode": tfa.DEFAULT_ISOLATION, "index": gpu.index,
            "numaNode": gpu.index // 2, "usedBy": tfa.USED_BY_TENSOR_FUSION,
            "runningApps": [{"name": name, "namespace": ns, "count": len(pods), "pods": pods}
                            for (ns, name), pods in sorted(apps.items())],
        },
    }


def _gpunodes(gpus: list[_Gpu], ready: dict[str, bool], clock: float) -> list[dict[str, Any]]:
    by_node: dict[str, list[_Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.node].append(gpu)
    out = []
    for node, mine in by_node.items():
        pool = mine[0].pool
        total_t = sum(g.model.tflops_milli for g in mine)
        total_v = sum(g.model.vram for g in mine)
        free_t = sum(g.free_tflops for g in mine)
        free_v = sum(g.free_vram for g in mine)
        holders = {p["uid"] for g in mine for p in g.pods}
        out.append({
            "apiVersion": API_VERSION, "kind": "GPUNode",
            "metadata": {"name": node, "labels": {tfa.MANAGED_BY: pool, tfa.pool_label(pool): "true",
                                                  tfa.HARDWARE_VENDOR: "NVIDIA", tfa.GPU_POOL: pool}},
            "spec": {"manageMode": "AutoSelect"},
            "status": {
                "phase": "Running" if ready[node] else "Unknown",
                "totalTFlops": tflops_str(total_t), "totalVRAM": vram_str(total_v),
                "totalGPUs": len(mine), "managedGPUs": len(mine),
                "availableTFlops": tflops_str(free_t), "availableVRAM": vram_str(free_v),
                "virtualTFlops": tflops_str(total_t), "virtualVRAM": vram_str(total_v),
                "virtualAvailableTFlops": tflops_str(free_t), "virtualAvailableVRAM": vram_str(free_v),
                "managedGPUDeviceIDs": [g.name.upper() for g in mine], "totalGPUPods": len(holders),
                "allocatedPods": {g.name: [{k: v for k, v in p.items() if k != "workload"} for p in g.pods]
                                  for g in mine if g.pods},
                "hypervisorStatus": {"hypervisorState": "Running" if ready[node] else "Unknown",
                                     "hypervisorVersion": "0.1.0", "lastHeartbeatTime": rfc3339(clock - 5)},
            },
        })
    return out


def _pools(pool_names: list[str], gpus_by_pool: list[list[_Gpu]], ready: dict[str, bool]) -> list[dict[str, Any]]:
    out = []
    for i, (name, gpus) in enumerate(zip(pool_names, gpus_by_pool, strict=True)):
        nodes = sorted({g.node for g in gpus})
        up = sum(1 for n in nodes if ready[n])
        total_t = sum(g.model.tflops_milli for g in gpus)
        total_v = sum(g.model.vram for g in gpus)
        free_t = sum(g.free_tflops for g in gpus)
        free_v = sum(g.free_vram for g in gpus)
        running = len({(p["namespace"], p["workload"]) for g in gpus for p in g.pods})
        out.append({
            "apiVersion": API_VERSION, "kind": "GPUPool",
            "metadata": {"name": name, "annotations": {tfa.IS_DEFAULT_POOL: tfa.format_bool(i == 0)}},
            "spec": {
                "nodeManagerConfig": {
                    "provisioningMode": "AutoSelect", "defaultIsolationMode": tfa.DEFAULT_ISOLATION,
                    "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{
                        "key": "node.kubernetes.io/instance-type", "operator": "In",
                        "values": [f"gpu-{gpus[0].model.name.lower()}-{len(gpus) // max(1, len(nodes))}x"]}]}]}},
                "capacityConfig": {"oversubscription": {"tflopsOversellRatio": 100}},
                "qosConfig": {"defaultQoS": "medium", "pricing": [
                    {"qos": q, "requests": {"perFP16TFlopsPerHour": "$0.0069228", "perGBOfVRAMPerHour": "$0.01548"},
                     "limitsOverRequests": "1.2"} for q in tfa.QOS_LEVELS]},
            },
            "status": {
                "phase": "Running", "readyNodes": up, "notReadyNodes": len(nodes) - up, "totalNodes": len(nodes),
                "totalGPUs": len(gpus), "totalTFlops": tflops_str(total_t), "totalVRAM": vram_str(total_v),
                "availableTFlops": tflops_str(free_t), "availableVRAM": vram_str(free_v),
                "virtualTFlops": tflops_str(total_t), "virtualVRAM": vram_str(total_v),
                "virtualAvailableTFlops": tflops_str(free_t), "virtualAvailableVRAM": vram_str(free_v),
                "runningAppsCnt": running,
                "componentStatus": {"hypervisor": "0.1.0", "hypervisorConfigSynced": True,
                                    "worker": "0.1.0", "workerConfigSynced": True},
            },
        })
    return out


def _workload_object(w: _Workload, pool_names: list[str], mine: int, clock: float) -> dict[str, Any]:
    """The workload as the webhook creates it, with `mine` workers bound."""
    model = MODELS[w.pool % len(MODELS)]
    req_t, req_v, lim_t, lim_v = _amounts(model, w)
    return {
        "apiVersion": API_VERSION, "kind": "TensorFusionWorkload",
        "metadata": {"name": w.name, "namespace": w.namespace, "labels": {tfa.GPU_POOL: pool_names[w.pool]},
                     "annotations": {tfa.WORKLOAD_MODE: tfa.WORKLOAD_MODE_DYNAMIC},
                     "uid": _uid("workload", f"{w.namespace}/{w.name}"), "creationTimestamp": rfc3339(clock - 7200)},
        "spec": {
            "replicas": w.replicas, "poolName": pool_names[w.pool], "qos": w.qos, "isLocalGPU": True,
            "gpuCount": w.gpu_count, "gpuModel": model.name,
            "resources": {"requests": {"tflops": tflops_str(req_t), "vram": vram_str(req_v)},
                          "limits": {"tflops": tflops_str(lim_t), "vram": vram_str(lim_v)}},
        },
        "status": {"phase": "Running" if mine == w.replicas else "Pending", "workerCount": mine,
                   "readyWorkers": mine},
    }


def _quotas(used: dict[str, Usage], clock: float) -> list[dict[str, Any]]:
    """One quota per namespace, its status as the controller computes it (the same function)."""
    out = []
    for i, (ns, u) in enumerate(used.items()):
        # every fourth namespace is close to its budget (past the 90 % alert threshold), the rest use half
        num, den = (21, 20) if i % QUOTA_TIGHT_EVERY == 0 else (2, 1)
        spec = QuotaSpec(requests_tflops=_budget(u.requests_tflops, num, den, 1000),
                         requests_vram=_budget(u.requests_vram, num, den, GIB),
                         limits_tflops=_budget(u.limits_tflops, num, den, 1000),
                         limits_vram=_budget(u.limits_vram, num, den, GIB),
                         max_workers=max(10, u.workers * 2), alert_threshold_percent=90)
        status: dict[str, Any] = dict(quota_status_of(spec, u))
        status["conditions"] = [{**c, "lastTransitionTime": rfc3339(clock - 300)} for c in status["conditions"]]
        status["lastUpdateTime"] = rfc3339(clock - 30)
        assert spec.requests_tflops is not None and spec.requests_vram is not None
        assert spec.limits_tflops is not None and spec.limits_vram is not None
        out.append({
            "apiVersion": API_VERSION, "kind": "GPUResourceQuota",
            "metadata": {"name": f"{ns}-gpu-quota", "namespace": ns},
            "spec": {"total": {
                "requests": {"tflops": tflops_str(spec.requests_tflops), "vram": vram_str(spec.requests_vram)},
                "limits": {"tflops": tflops_str(spec.limits_tflops), "vram": vram_str(spec.limits_vram)},
                "maxWorkers": spec.max_workers, "alertThresholdPercent": spec.alert_threshold_percent}},
            "status": status,
        })
    return out


def _budget(used: int, num: int, den: int, unit: int) -> int:
    """`used * num / den` rounded up to whole units (whole TFLOPS, whole GiB), at least one unit."""
    return max(unit, -(-used * num // den // unit) * unit)


def _events(bound: list[dict[str, Any]], waiting: list[dict[str, Any]], clock: float) -> list[dict[str, Any]]:
    """What the operator reports: a GPU allocation per bound pod (the newest 500), a failure per pending one."""
    out = []
    for i, pod in enumerate(bound[-500:]):
        gpus = pod["metadata"]["annotations"][tfa.GPU_IDS]
        out.append(_event(pod, "Normal", "GPUAllocated", f"allocated GPU(s) {gpus} on node {pod['spec']['nodeName']}",
                          clock - 3600 + i))
    for i, pod in enumerate(waiting):
        out.append(_event(pod, "Warning", "FailedScheduling", pod["status"]["conditions"][0]["message"],
                          clock - 60 + i % 60, count=3))
    return out


def _event(pod: dict[str, Any], type_: str, reason: str, message: str, at: float, count: int = 1) -> dict[str, Any]:
    meta = pod["metadata"]
    stamp = rfc3339(at)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{int(at * 1e9):x}", "namespace": meta["namespace"],
                     "creationTimestamp": stamp},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": reason, "message": message, "type": type_, "count": count,
        "firstTimestamp": rfc3339(at - 60 * (count - 1)), "lastTimestamp": stamp,
        "source": {"component": OPERATOR}, "reportingComponent": OPERATOR,
        "reportingInstance": f"{OPERATOR}-7b9c5d4f6-x2k8p",
    }


def _provider_config() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": "ProviderConfig", "metadata": {"name": "nvidia"},
        "spec": {"vendor": "NVIDIA", "images": {"middleware": "tensorfusion/ngpu:latest"},
                 "hardwareMetadata": [
                     {"model": m.name, "fullModelName": m.full_name, "fp16TFlops": tflops_str(m.tflops_milli),
                      "costPerHour": m.cost_per_hour} for m in MODELS]},
    }
