"""The hypervisor's HTTP API on --port (default 8001): the routes of the seed's table, with the
original's envelopes (`{"data": ...}` / `{"error": "..."}`) and JSON keys, plus local-mode
worker creation and deletion.

The two routes that identify a calling pod (`GET /api/v1/pod` with a token or container_name, and
`POST /api/v1/process`) check its service-account token with a TokenReview and use only the pod
UID the API server vouches for. The original decodes the JWT without checking its signature; we
do not.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.exceptions import HTTPException
from prometheus_client import CollectorRegistry

from tfusion.hypervisor.devices.backend import DeviceBackendError
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.workers.model import WorkerAllocation
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.hypervisor.workers.tracker import WorkerTracker
from tfusion.kube.auth import ReviewUnavailable, Unauthenticated
from tfusion.settings import Settings
from tfusion.web import Readiness, health_handlers, make_app, metrics_handler

log = logging.getLogger(__name__)

AUTH_NEEDS_KUBERNETES = ("token authentication needs the Kubernetes backend (--backend=kubernetes); "
                         "this hypervisor runs with --backend=local")


class ApiError(Exception):
    """A caller's mistake (or an unavailable dependency) with its HTTP status and message."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


@dataclass
class HypervisorContext:
    """Everything the routes read."""

    settings: Settings
    registry: DeviceRegistry
    workers: WorkerTracker
    readiness: Readiness
    metrics_registry: CollectorRegistry
    reviewer: Any = None  # tfusion.kube.auth.TokenReviewer in Kubernetes mode
    procfs: ProcFS = field(default_factory=ProcFS)
    pods_by_uid: Any = None  # Kubernetes mode: uid -> pod name/namespace, for messages

    @property
    def isolation_policy(self) -> str:
        return self.settings.isolation_policy

    def device_wire(self, device: DeviceInfo) -> dict[str, Any]:
        return device.to_wire(self.settings.isolation_mode, self.settings.isolation_policy)

    def allocation_wire(self, allocation: WorkerAllocation) -> dict[str, Any]:
        return allocation.to_wire(isolation_mode=self.settings.isolation_mode,
                                  isolation_policy=self.settings.isolation_policy,
                                  running=self.workers.running_info(allocation.worker.uid))


def _data(value: Any, status: int = 200) -> Response[Any]:
    return Response({"data": value}, status_code=status)


def _error(status: int, message: str, **extra: Any) -> Response[Any]:
    return Response({"error": message, **extra}, status_code=status)


def _api_error_handler(_: Request[Any, Any, Any], exc: ApiError) -> Response[Any]:
    return _error(exc.status, exc.message, **exc.extra)


def _http_error_handler(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return _error(exc.status_code, str(exc.detail))


def _unexpected_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}: {exc}")


# --- workers: usage per device and process -------------------------------------------------------

def worker_metrics(ctx: HypervisorContext, allocation: WorkerAllocation) -> dict[str, dict[str, Any]]:
    """{deviceUUID: {hostPID: WorkerMetrics}} for one worker, from the last process sample."""
    uid = allocation.worker.uid
    by_uuid = {d.uuid: d for d in allocation.devices}
    result: dict[str, dict[str, Any]] = {u: {} for u in by_uuid}
    for proc in ctx.registry.processes():
        if proc.device_uuid not in by_uuid or ctx.workers.worker_for_pid(proc.pid) != uid:
            continue
        device = by_uuid[proc.device_uuid]
        limit = allocation.worker.limits.vram_bytes
        result[proc.device_uuid][str(proc.pid)] = {
            "DeviceUUID": proc.device_uuid, "WorkerUID": uid, "ProcessID": str(proc.pid),
            "MemoryBytes": proc.used_memory_bytes,
            "MemoryPercentage": proc.used_memory_bytes / limit * 100 if limit else 0.0,
            "ComputePercentage": proc.compute_percent,
            "ComputeTflops": proc.compute_percent / 100 * device.max_tflops, "ExtraMetrics": {},
        }
    return result


def build_app(ctx: HypervisorContext) -> Any:
    """The Litestar app for one hypervisor."""

    # --- devices -----------------------------------------------------------------------------------

    @get("/api/v1/devices", sync_to_thread=False)
    def list_devices() -> Response[Any]:
        return _data([ctx.device_wire(d) for d in ctx.registry.devices()])

    @get("/api/v1/devices/{uuid:str}", sync_to_thread=False)
    def get_device(uuid: str) -> Response[Any]:
        device = ctx.registry.get(uuid)
        if device is None:
            return _error(404, "Device not found")
        return _data(ctx.device_wire(device))

    @post("/api/v1/devices/discover", status_code=200)
    async def discover() -> Response[Any]:
        try:
            changes = await ctx.registry.discover()
        except DeviceBackendError as exc:
            return _error(503, f"device discovery failed: {exc}")
        return Response({"status": "Device discovery triggered", "devices": len(changes.current),
                         "added": [d.uuid for d in changes.added], "removed": [d.uuid for d in changes.removed]})

    # --- workers -----------------------------------------------------------------------------------

    @get("/api/v1/workers", sync_to_thread=False)
    def list_workers() -> Response[Any]:
        return _data([ctx.allocation_wire(a) for a in ctx.workers.allocations()])

    @get("/api/v1/workers/{worker_id:str}", sync_to_thread=False)
    def get_worker(worker_id: str) -> Response[Any]:
        allocation = ctx.workers.get(worker_id)
        if allocation is None:
            return _error(404, "worker not found")
        return _data({"worker_uid": allocation.worker.uid, "allocation": ctx.allocation_wire(allocation),
                      "metrics": worker_metrics(ctx, allocation)})

    @post("/api/v1/workers", status_code=201)
    async def create_worker(request: Request[Any, Any, Any]) -> Response[Any]:
        create = getattr(ctx.workers, "create", None)
        if create is None:
            return _error(405, "workers are Kubernetes pods with --backend=kubernetes; "
                               "POST /api/v1/workers needs --backend=local")
        body = await _json_body(request)
        allocation = await create(body)
        return _data(ctx.allocation_wire(allocation), 201)

    @delete("/api/v1/workers/{worker_id:str}", status_code=200)
    async def delete_worker(worker_id: str) -> Response[Any]:
        remove = getattr(ctx.workers, "remove", None)
        if remove is None:
            return _error(405, "workers are Kubernetes pods with --backend=kubernetes; delete the pod instead")
        allocation = await remove(worker_id)
        if allocation is None:
            return _error(404, "worker not found")
        return _data({"worker_uid": allocation.worker.uid, "released": [d.uuid for d in allocation.devices]})

    @post("/api/v1/workers/{worker_id:str}/snapshot", status_code=501)
    async def snapshot(worker_id: str) -> Response[Any]:
        if ctx.workers.get(worker_id) is None:
            return _error(404, "worker not found")
        return _error(501, "worker snapshot is not implemented yet")

    @post("/api/v1/workers/{worker_id:str}/resume", status_code=501)
    async def resume(worker_id: str) -> Response[Any]:
        if ctx.workers.get(worker_id) is None:
            return _error(404, "worker not found")
        return _error(501, "worker resume is not implemented yet")

    # --- limiter routes ----------------------------------------------------------------------------

    @get("/api/v1/limiter", sync_to_thread=False)
    def limiter() -> Response[Any]:
        return Response({"limiters": [
            {"worker_uid": a.worker.uid, "requests": a.worker.requests.to_wire(),
             "limits": a.worker.limits.to_wire()} for a in ctx.workers.allocations()]})

    @post("/api/v1/trap", status_code=200)
    async def trap() -> Response[Any]:
        count = sum(1 for a in ctx.workers.allocations() if a.worker.qos in ("low", "medium"))
        return Response({"message": "trap initiated", "snapshot_count": count})

    @get("/api/v1/pod")
    async def pod(request: Request[Any, Any, Any]) -> Response[Any]:
        container = request.query_params.get("container_name") or ""
        auth = request.headers.get("authorization")
        if auth is None and not container:
            return Response({"pods": [_legacy_pod(a) for a in ctx.workers.allocations()]})
        allocation = await _authenticated_worker(ctx, auth)
        if isinstance(allocation, Response):
            return allocation
        return Response({"success": True, "data": remote_pod_info(ctx, allocation, container),
                         "message": f"Pod {allocation.worker.name} information retrieved successfully"})

    @post("/api/v1/process", status_code=200)
    async def process(request: Request[Any, Any, Any]) -> Response[Any]:
        container = request.query_params.get("container_name") or ""
        pid_text = request.query_params.get("container_pid") or ""
        if not container:
            return _error(400, "container_name query parameter is required")
        if not pid_text.isdigit() or int(pid_text) == 0:
            return _error(400, f"container_pid query parameter must be a positive integer, got {pid_text!r}")
        allocation = await _authenticated_worker(ctx, request.headers.get("authorization"))
        if isinstance(allocation, Response):
            return allocation
        worker = allocation.worker
        host_pid = ctx.procfs.find_container_process(worker.namespace, worker.name, container, int(pid_text))
        if host_pid is None:
            return Response({"success": False, "data": None, "message": (
                f"Failed to initialize process: process not found for pod {worker.namespace}/{worker.name} "
                f"container {container} pid {pid_text}")})
        return Response({"success": True, "message": "Process initialized successfully", "data": {
            "host_pid": host_pid, "container_pid": int(pid_text), "container_name": container,
            "pod_name": worker.name, "namespace": worker.namespace}})

    handlers = [*health_handlers(ctx.readiness), metrics_handler(ctx.metrics_registry), list_devices, get_device,
                discover, list_workers, get_worker, create_worker, delete_worker, snapshot, resume, limiter,
                trap, pod, process]
    return make_app(handlers, title="tfusion hypervisor", exception_handlers={
        ApiError: _api_error_handler, HTTPException: _http_error_handler, Exception: _unexpected_handler})


async def _json_body(request: Request[Any, Any, Any]) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


async def _authenticated_worker(ctx: HypervisorContext, auth: str | None) -> WorkerAllocation | Response[Any]:
    """The worker the bearer token's pod is, or the response that refuses the call."""
    if ctx.reviewer is None:
        return _error(401, AUTH_NEEDS_KUBERNETES)
    if not auth:
        return _error(401, "missing authorization header")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "authorization header must be 'Bearer <service-account token>'")
    try:
        reviewed = await ctx.reviewer.review(token.strip())
    except ReviewUnavailable as exc:
        return _error(503, f"cannot verify the token now: {exc.reason}")
    except Unauthenticated as exc:
        return _error(401, f"invalid token: {exc.reason}")
    if not reviewed.pod_uid:
        return _error(401, f"token of {reviewed.username or 'unknown user'} is not bound to a pod")
    allocation = ctx.workers.get(reviewed.pod_uid)
    if allocation is None:
        # A genuine token, but of a pod this node holds no allocation for: a foreign caller.
        return _error(401, f"token of pod {reviewed.namespace}/{reviewed.pod_name} (uid {reviewed.pod_uid}) "
                           "is not for a worker with an allocation on this node")
    return allocation


def _legacy_pod(allocation: WorkerAllocation) -> dict[str, Any]:
    worker = allocation.worker
    info: dict[str, Any] = {"pod_name": worker.name, "namespace": worker.namespace,
                            "gpu_uuids": [d.uuid for d in allocation.devices] or list(worker.allocated_devices)}
    if worker.limits.tflops_milli:
        info["tflops_limit"] = worker.limits.tflops
    if worker.limits.vram_bytes:
        info["vram_limit"] = worker.limits.vram_bytes
    if worker.qos:
        info["qos_level"] = worker.qos.lower()
    return info


def _upper_gpu_prefix(uuid: str) -> str:
    return "GPU-" + uuid[4:] if uuid.lower().startswith("gpu-") else uuid


def remote_pod_info(ctx: HypervisorContext, allocation: WorkerAllocation, container: str) -> dict[str, Any]:
    """The RemotePodInfo the in-pod limiter reads from `GET /api/v1/pod`."""
    worker = allocation.worker
    uuids = worker.container_gpus.get(container) if container else None
    if not uuids:
        uuids = [d.uuid for d in allocation.devices] or list(worker.allocated_devices)
    info: dict[str, Any] = {"pod_name": worker.name, "namespace": worker.namespace,
                            "gpu_uuids": [_upper_gpu_prefix(u) for u in uuids]}
    if worker.limits.tflops_milli:
        info["tflops_limit"] = worker.limits.tflops
    if worker.limits.vram_bytes:
        info["vram_limit"] = worker.limits.vram_bytes
    if worker.qos:
        info["qos_level"] = worker.qos.capitalize()
    info["compute_shard"] = False
    info["isolation"] = worker.isolation
    freeze = auto_freeze_rule(ctx.settings.scheduling_config, worker.qos)
    if freeze is not None:
        info["auto_freeze"] = freeze
    return info


def auto_freeze_rule(scheduling_config: str, qos: str) -> dict[str, Any] | None:
    """The `autoFreezeAndResume.autoFreeze[]` rule for a QoS from TF_HYPERVISOR_SCHEDULING_CONFIG."""
    if not scheduling_config.strip():
        return None
    try:
        config = json.loads(scheduling_config)
    except ValueError:
        return None
    rules = ((config or {}).get("autoFreezeAndResume") or {}).get("autoFreeze") or []
    for rule in rules:
        if isinstance(rule, dict) and str(rule.get("qos", "")).lower() == qos.lower():
            result: dict[str, Any] = {"enable": bool(rule.get("enable", False))}
            if rule.get("freezeToMemTTL"):
                result["freeze_to_mem_ttl"] = str(rule["freezeToMemTTL"])
            if rule.get("freezeToDiskTTL"):
                result["freeze_to_disk_ttl"] = str(rule["freezeToDiskTTL"])
            return result
    return None
