"""The hypervisor's HTTP API on --port (default 8001): the routes of the seed's table, with the
original's envelopes (`{"data": ...}` / `{"error": "..."}`) and JSON keys, plus local-mode
worker creation and deletion.

The two routes that identify a calling pod (`GET /api/v1/pod` with a token or container_name, and
`POST /api/v1/process`) check its service-account token with a TokenReview and use only the pod
UID the API server vouches for. For a soft worker both also make sure its shared-memory file
exists (opened, or created only when missing; a file that exists but is unusable is reported as
`Failed to prepare shared memory: ...`, never truncated), and `/process` adds the host PID to the
file's PID set (dropping PIDs that have exited) and, for a pod whose securityContext names no user,
gives the file to the user that process runs as (`SoftIsolation.hand_to_caller`). The token comes
as `Authorization: Bearer <token>` or, as the original also accepts, as the raw
`Authorization: <token>`. The original decodes the JWT without checking its signature; we do not.

`GET /api/v1/pod` with neither a token nor container_name is the seed's troubleshooting listing:
each worker with an allocation here, with only its name, namespace, GPUs, limits and QoS (less
than the equally open `/api/v1/workers`). It is not authenticated, like every route but the two
above: the node API relies on network isolation.

Bodies are the Structs of `http_bodies` (so the OpenAPI document describes them); errors are raised
as `HttpError`/`ApiError` and answered by the shared edge in `tfusion.web`. The document describes
exactly the routes this hypervisor serves: creating and deleting workers exist only with the local
backend, and each path's OPTIONS answer lists all of its methods (a test runs schemathesis
`--checks all` against both backends).

Bounded input: `POST /api/v1/workers` takes at most 1 MiB (413 beyond), parsed by the bounded
JSON reader (`tfusion.api.documents`: 400 for a document over 100 levels deep or a number beyond
64 bits); every other route takes at most the edge's 64 KiB default. With `--api-token-file`
(required by role.py when the local backend listens beyond loopback) creating and deleting
workers, which start and stop commands, need `Authorization: Bearer <that token>`, compared in
constant time; everything else stays as the seed says (network isolation).
"""

from __future__ import annotations

import hmac
import logging
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import orjson
from litestar import Request, Response, delete, get, post, route
from litestar.enums import HttpMethod
from litestar.exceptions import HTTPException, MethodNotAllowedException
from litestar.handlers import HTTPRouteHandler
from litestar.params import Parameter
from prometheus_client import CollectorRegistry

from tfusion.api import accessors
from tfusion.api.documents import DocumentError, load_json
from tfusion.api.jsontypes import JsonObject, JsonValue
from tfusion.hypervisor import http_bodies as bodies
from tfusion.hypervisor.devices.backend import DeviceBackendError
from tfusion.hypervisor.devices.model import DeviceInfo, DeviceWire
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.usage_http import usage_handlers
from tfusion.hypervisor.workers.model import AllocationWire, WorkerAllocation
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.hypervisor.workers.tracker import WorkerFactory, WorkerTracker
from tfusion.kube.auth import AUTH_FIELD, AUTH_FORMS, Unauthenticated, authenticate, bearer_token
from tfusion.settings import Settings
from tfusion.web import (
    EXCEPTION_HANDLERS,
    ErrorBody,
    HttpError,
    Readiness,
    decode_body,
    error_responses,
    health_handlers,
    make_app,
    metrics_handler,
    raw_body,
)

log = logging.getLogger(__name__)

AUTH_NEEDS_KUBERNETES = ("token authentication needs the Kubernetes backend (--backend=kubernetes); "
                         "this hypervisor runs with --backend=local")
#: a worker's create request: names, a command line, env and labels; 1 MiB is far more than any needs
WORKER_REQUEST_MAX_BYTES = 1024 * 1024
API_TOKEN_HEADER = Parameter(header="authorization", required=False,
                             description="`Bearer <token>` with the token of --api-token-file, when the "
                                         "hypervisor has one (required when it listens beyond loopback)")
TOKEN_HEADER = Parameter(header="authorization", required=False,
                         description=f"The calling pod's service-account token: {AUTH_FORMS}")


class ApiError(HttpError):
    """A caller's mistake (or an unavailable dependency) with its HTTP status and message; `extra`
    are PlacementErrorBody's structured fields (field, free, reasons)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(status, msgspec.convert({"error": message, **extra}, bodies.PlacementErrorBody))
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
    #: local backend: the bearer token (--api-token-file) that creating and deleting workers need
    api_token: str | None = None
    pods_by_uid: Any = None  # Kubernetes mode: uid -> pod name/namespace, for messages
    soft: Any = None  # tfusion.hypervisor.limiter.soft.SoftIsolation: the soft workers' shared memory
    scheduling: Any = None  # tfusion.hypervisor.limiter.config.SchedulingConfig: env over the pool's template
    partitioner: Any = None  # tfusion.hypervisor.partitions.Partitioner (Kubernetes mode): partition devices

    @property
    def isolation_policy(self) -> str:
        return self.settings.resolved_hypervisor_isolation_policy

    def devices(self) -> list[DeviceInfo]:
        """The node's GPUs, then the partitions (MIG devices) made on them, each naming its parent."""
        partitions = self.partitioner.devices() if self.partitioner is not None else []
        return [*self.registry.devices(), *partitions]

    def device_wire(self, device: DeviceInfo) -> DeviceWire:
        return device.to_wire(self.settings.isolation_mode, self.settings.resolved_hypervisor_isolation_policy)

    def allocation_wire(self, allocation: WorkerAllocation) -> AllocationWire:
        return allocation.to_wire(isolation_mode=self.settings.isolation_mode,
                                  isolation_policy=self.settings.resolved_hypervisor_isolation_policy,
                                  running=self.workers.running_info(allocation.worker.uid))

    def device_body(self, device: DeviceInfo) -> bodies.Device:
        return msgspec.convert(self.device_wire(device), bodies.Device)

    def allocation_body(self, allocation: WorkerAllocation) -> bodies.WorkerAllocation:
        return msgspec.convert(self.allocation_wire(allocation), bodies.WorkerAllocation)


# --- workers: usage per device and process -------------------------------------------------------

def worker_metrics(ctx: HypervisorContext, allocation: WorkerAllocation) -> dict[str, dict[str, JsonObject]]:
    """{deviceUUID: {hostPID: WorkerMetrics}} for one worker, from the last process sample."""
    uid = allocation.worker.uid
    by_uuid = {d.uuid: d for d in allocation.devices}
    result: dict[str, dict[str, JsonObject]] = {u: {} for u in by_uuid}
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


WORKER_NOT_FOUND = "worker not found"
WORKERS_ARE_PODS = ("Workers are Kubernetes pods with --backend=kubernetes: create or delete the pod instead; "
                    "POST /api/v1/workers and DELETE /api/v1/workers/<id> need --backend=local")
#: a container PID as `POST /api/v1/process` takes it: ASCII digits, not zero (Unicode digits are not PIDs)
POSITIVE_PID = re.compile(r"0*[1-9][0-9]*")
#: the same rule in the document (a JSON Schema pattern matches anywhere unless anchored)
POSITIVE_PID_PATTERN = f"^{POSITIVE_PID.pattern}$"
_UNKNOWN_WORKER = error_responses({404: "No worker with this UID on this node"})
_TOKEN_ERRORS = error_responses({401: "No, an invalid or a foreign token (or --backend=local)",
                                 503: "The API server cannot review the token now"})


def build_app(ctx: HypervisorContext) -> Any:
    """The Litestar app for one hypervisor."""
    handlers = [*health_handlers(ctx.readiness), *_device_handlers(ctx), *_worker_handlers(ctx),
                *_limiter_handlers(ctx), *usage_handlers(ctx)]
    extra = {} if isinstance(ctx.workers, WorkerFactory) else {
        "exception_handlers": {MethodNotAllowedException: _pods_not_workers}}
    return make_app([*_options_handlers(handlers), *handlers, metrics_handler(ctx.metrics_registry)],
                    title="tfusion hypervisor", **extra)


def _pods_not_workers(request: Request[Any, Any, Any], exc: MethodNotAllowedException) -> Response[Any]:
    """The shared 405 answer; for POST or DELETE on a worker in Kubernetes mode, also what to do instead."""
    response: Response[Any] = EXCEPTION_HANDLERS[HTTPException](request, exc)
    body = response.content
    if request.method in ("POST", "DELETE") and request.url.path.startswith("/api/v1/workers") \
            and isinstance(body, ErrorBody):
        response.content = msgspec.structs.replace(body, error=f"{body.error}. {WORKERS_ARE_PODS}")
    return response


def _options_handlers(handlers: list[Any]) -> list[Any]:
    """One OPTIONS handler per path, whose Allow lists every method the path has.

    Litestar's own OPTIONS answer lists only the methods of the first handler registered for a path
    (`GET, OPTIONS` on /api/v1/workers, which also takes POST), so Allow would disagree with the
    document and with the 405 answers. Registered before the others, these replace it."""
    methods: dict[str, set[str]] = {}
    for handler in handlers:
        if isinstance(handler, HTTPRouteHandler):
            for path in handler.paths:
                methods.setdefault(path, set()).update(handler.http_methods)
    return [_options_handler(path, ", ".join(sorted(allowed | {"OPTIONS"}))) for path, allowed in methods.items()]


def _options_handler(path: str, allow: str) -> Any:
    @route(path, http_method=[HttpMethod.OPTIONS], include_in_schema=False, sync_to_thread=False,
           name=f"options {path}")
    def options() -> Response[None]:
        return Response(None, status_code=204, headers={"Allow": allow})

    return options


def _device_handlers(ctx: HypervisorContext) -> list[Any]:
    @get("/api/v1/devices", sync_to_thread=False, summary="Every device of this node")
    def list_devices() -> bodies.DeviceList:
        return bodies.DeviceList(data=[ctx.device_body(d) for d in ctx.devices()])

    @get("/api/v1/devices/{uuid:str}", sync_to_thread=False, summary="One device by its lowercase UUID",
         responses=error_responses({404: "Device not found"}))
    def get_device(uuid: str) -> bodies.DeviceAnswer:
        device = ctx.registry.get(uuid) or next((d for d in ctx.devices() if d.uuid == uuid), None)
        if device is None:
            raise HttpError(404, "Device not found")
        return bodies.DeviceAnswer(data=ctx.device_body(device))

    @post("/api/v1/devices/discover", status_code=200, summary="Discover the devices again, now",
          responses=error_responses({503: "The device backend failed"}))
    async def discover() -> bodies.DiscoveryResult:
        try:
            changes = await ctx.registry.discover()
        except DeviceBackendError as exc:
            raise HttpError(503, f"device discovery failed: {exc}") from None
        return bodies.DiscoveryResult(status="Device discovery triggered", devices=len(changes.current),
                                      added=[d.uuid for d in changes.added],
                                      removed=[d.uuid for d in changes.removed])

    return [list_devices, get_device, discover]


def _worker_handlers(ctx: HypervisorContext) -> list[Any]:
    @get("/api/v1/workers", sync_to_thread=False, summary="Every worker with an allocation on this node")
    def list_workers() -> bodies.WorkerList:
        return bodies.WorkerList(data=[ctx.allocation_body(a) for a in ctx.workers.allocations()])

    @get("/api/v1/workers/{worker_id:str}", sync_to_thread=False, summary="One worker and its usage",
         responses=_UNKNOWN_WORKER)
    def get_worker(worker_id: str) -> bodies.WorkerDetailAnswer:
        allocation = ctx.workers.get(worker_id)
        if allocation is None:
            raise HttpError(404, WORKER_NOT_FOUND)
        metrics = msgspec.convert(worker_metrics(ctx, allocation), dict[str, dict[str, bodies.WorkerMetrics]])
        return bodies.WorkerDetailAnswer(data=bodies.WorkerDetail(
            worker_uid=allocation.worker.uid, allocation=ctx.allocation_body(allocation), metrics=metrics))

    def not_implemented(worker_id: str, action: str) -> ErrorBody:
        """The original's answer for snapshot and resume: 404 for an unknown worker, else 501."""
        if ctx.workers.get(worker_id) is None:
            raise HttpError(404, WORKER_NOT_FOUND)
        return ErrorBody(error=f"worker {action} is not implemented yet")

    @post("/api/v1/workers/{worker_id:str}/snapshot", status_code=501, summary="Not implemented yet",
          responses=_UNKNOWN_WORKER)
    async def snapshot(worker_id: str) -> ErrorBody:
        return not_implemented(worker_id, "snapshot")

    @post("/api/v1/workers/{worker_id:str}/resume", status_code=501, summary="Not implemented yet",
          responses=_UNKNOWN_WORKER)
    async def resume(worker_id: str) -> ErrorBody:
        return not_implemented(worker_id, "resume")

    return [list_workers, get_worker, *_factory_handlers(ctx), snapshot, resume]


def _factory_handlers(ctx: HypervisorContext) -> list[Any]:
    """Creating and deleting workers, with the local backend only: in Kubernetes mode workers are
    pods, and these routes do not exist (the document, Allow and the 405 answers all say so)."""
    factory = ctx.workers
    if not isinstance(factory, WorkerFactory):
        return []

    @post("/api/v1/workers", status_code=201, summary="Create a local worker (--backend=local only)",
          request_max_body_size=WORKER_REQUEST_MAX_BYTES,
          responses=error_responses({
              400: "The body is not a JSON object",
              401: "The hypervisor has an --api-token-file and the request does not carry its token",
              409: "The worker does not fit (`free`, `reasons`) or its name is taken",
              422: "A field is invalid; `field` names it"}, bodies.PlacementErrorBody),
          **raw_body(bodies.WorkerCreateRequest, description="The worker to create"))
    async def create_worker(request: Request[Any, Any, Any],
                            authorization: Annotated[str | None, API_TOKEN_HEADER] = None) -> bodies.WorkerCreated:
        _require_api_token(ctx, authorization)
        body = await decode_body(request, _json_object)
        allocation = await factory.create(body)
        return bodies.WorkerCreated(data=ctx.allocation_body(allocation))

    @delete("/api/v1/workers/{worker_id:str}", status_code=200,
            summary="Delete a local worker (--backend=local only)",
            responses={**_UNKNOWN_WORKER, **error_responses({
                401: "The hypervisor has an --api-token-file and the request does not carry its token"})})
    async def delete_worker(worker_id: str,
                            authorization: Annotated[str | None, API_TOKEN_HEADER] = None,
                            ) -> bodies.WorkerReleasedAnswer:
        _require_api_token(ctx, authorization)
        allocation = await factory.remove(worker_id)
        if allocation is None:
            raise HttpError(404, WORKER_NOT_FOUND)
        return bodies.WorkerReleasedAnswer(data=bodies.WorkerReleased(
            worker_uid=allocation.worker.uid, released=[d.uuid for d in allocation.devices]))

    return [create_worker, delete_worker]


def _limiter_handlers(ctx: HypervisorContext) -> list[Any]:
    @get("/api/v1/limiter", sync_to_thread=False, summary="Requests and limits of every worker")
    def limiter() -> bodies.LimiterList:
        return msgspec.convert({"limiters": [
            {"worker_uid": a.worker.uid, "requests": a.worker.requests.to_wire(),
             "limits": a.worker.limits.to_wire()} for a in ctx.workers.allocations()]}, bodies.LimiterList)

    @post("/api/v1/trap", status_code=200, summary="Count the workers a trap would snapshot")
    async def trap() -> bodies.TrapResult:
        count = sum(1 for a in ctx.workers.allocations() if a.worker.qos in ("low", "medium"))
        return bodies.TrapResult(message="trap initiated", snapshot_count=count)

    @get("/api/v1/pod", summary="The calling pod's limits (with its token), or every worker (without)",
         responses=_TOKEN_ERRORS)
    async def pod(container_name: Annotated[str, Parameter(
                      query="container_name", description="The calling container; selects its GPUs")] = "",
                  authorization: Annotated[str | None, TOKEN_HEADER] = None,
                  ) -> bodies.RemotePodAnswer | bodies.LegacyPods:
        if authorization is None and not container_name:
            return msgspec.convert({"pods": [_legacy_pod(a) for a in ctx.workers.allocations()]}, bodies.LegacyPods)
        allocation = await _authenticated_worker(ctx, authorization)
        problem = _prepare_shm(ctx, allocation)
        if problem:
            return bodies.RemotePodAnswer(success=False, data=None, message=problem)
        return msgspec.convert({"success": True, "data": remote_pod_info(ctx, allocation, container_name),
                                "message": f"Pod {allocation.worker.name} information retrieved successfully"},
                               bodies.RemotePodAnswer)

    @post("/api/v1/process", status_code=200, summary="Map a container's PID to the host PID",
          responses={**_TOKEN_ERRORS, **error_responses({400: "container_name or container_pid is missing"})})
    async def process(container_name: Annotated[str, Parameter(
                          query="container_name", required=True, schema_extra={"min_length": 1},
                          description="The calling container")] = "",
                      container_pid: Annotated[str, Parameter(
                          query="container_pid", required=True, schema_extra={"pattern": POSITIVE_PID_PATTERN},
                          description="The PID inside the container, a positive decimal integer")] = "",
                      authorization: Annotated[str | None, TOKEN_HEADER] = None) -> bodies.ProcessAnswer:
        if not container_name:
            raise HttpError(400, ErrorBody(error="container_name query parameter is required",
                                                  field="container_name"))
        if not POSITIVE_PID.fullmatch(container_pid):
            raise HttpError(400, ErrorBody(
                error=f"container_pid query parameter must be a positive integer, got {container_pid!r}",
                field="container_pid"))
        allocation = await _authenticated_worker(ctx, authorization)
        worker = allocation.worker
        problem = _prepare_shm(ctx, allocation)
        if problem:
            return bodies.ProcessAnswer(success=False, data=None, message=problem)
        host_pid = ctx.procfs.find_container_process(worker.namespace, worker.name, container_name,
                                                     int(container_pid))
        if host_pid is None:
            return bodies.ProcessAnswer(success=False, data=None, message=(
                f"Failed to initialize process: process not found for pod {worker.namespace}/{worker.name} "
                f"container {container_name} pid {container_pid}"))
        _register_pid(ctx, allocation, host_pid)
        return bodies.ProcessAnswer(success=True, message="Process initialized successfully", data=bodies.ProcessInfo(
            host_pid=host_pid, container_pid=int(container_pid), container_name=container_name,
            pod_name=worker.name, namespace=worker.namespace))

    return [limiter, trap, pod, process]


def _is_soft(ctx: HypervisorContext, allocation: WorkerAllocation) -> bool:
    return ctx.soft is not None and allocation.worker.isolation == "soft"


def _prepare_shm(ctx: HypervisorContext, allocation: WorkerAllocation) -> str:
    """Make sure a soft worker's shared memory exists; the failure message, or "" when all is well."""
    if not _is_soft(ctx, allocation):
        return ""
    from tfusion.hypervisor.shm.state import ShmError

    try:
        ctx.soft.ensure_for(allocation)
    except (ShmError, OSError) as exc:
        log.warning("shared memory of worker %s/%s: %s", allocation.worker.namespace, allocation.worker.name, exc)
        return f"Failed to prepare shared memory: {exc}"
    return ""


def _register_pid(ctx: HypervisorContext, allocation: WorkerAllocation, host_pid: int) -> None:
    """Add the PID to a soft worker's PID set; as upstream, a failure is logged and the call still succeeds."""
    if not _is_soft(ctx, allocation):
        return
    from tfusion.hypervisor.shm.state import ShmError

    try:
        ctx.soft.register_pid(allocation, host_pid)
        uid = ctx.procfs.effective_uid(host_pid)
        if uid is not None:
            ctx.soft.hand_to_caller(allocation, uid)
    except (ShmError, OSError) as exc:
        log.warning("cannot register PID %d of worker %s/%s: %s", host_pid, allocation.worker.namespace,
                    allocation.worker.name, exc)


def _json_object(raw: bytes) -> JsonObject:
    """The body as a JSON object, bounded (`tfusion.api.documents`: depth, number size)."""
    if not raw.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        body = load_json(raw)
    except DocumentError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _require_api_token(ctx: HypervisorContext, authorization: str | None) -> None:
    """With --api-token-file, the worker routes (which run and stop commands) need its token."""
    if ctx.api_token is None:
        return
    if not authorization:
        raise HttpError(401, "missing authorization header: this hypervisor needs 'Bearer <token>' with the "
                             "token of its --api-token-file to create or delete workers",
                        headers={"WWW-Authenticate": "Bearer"})
    token = bearer_token(authorization) or ""
    if not hmac.compare_digest(token.encode(), ctx.api_token.encode()):
        raise HttpError(401, "invalid token: it is not the token of this hypervisor's --api-token-file",
                        headers={"WWW-Authenticate": "Bearer"})


async def _authenticated_worker(ctx: HypervisorContext, auth: str | None) -> WorkerAllocation:
    """The worker the token's pod is; raises the HttpError that refuses the call otherwise."""
    if ctx.reviewer is None:
        raise HttpError(401, AUTH_NEEDS_KUBERNETES)
    try:
        reviewed = await authenticate(ctx.reviewer, auth, pod_bound=True)
        allocation = ctx.workers.get(reviewed.pod_uid)
        if allocation is None:  # a genuine token, but of a pod this node holds no allocation for
            raise Unauthenticated(f"the token of {reviewed.username} (pod {reviewed.namespace}/{reviewed.pod_name}, "
                                  f"uid {reviewed.pod_uid}) is not for a worker with an allocation on this node")
    except Unauthenticated as exc:
        raise HttpError(exc.status, ErrorBody(error=exc.message, field=AUTH_FIELD)) from None
    return allocation


def _legacy_pod(allocation: WorkerAllocation) -> JsonObject:
    worker = allocation.worker
    uuids: list[JsonValue] = [d.uuid for d in allocation.devices] or list(worker.allocated_devices)
    info: JsonObject = {"pod_name": worker.name, "namespace": worker.namespace, "gpu_uuids": uuids}
    if worker.limits.tflops_milli:
        info["tflops_limit"] = worker.limits.tflops
    if worker.limits.vram_bytes:
        info["vram_limit"] = worker.limits.vram_bytes
    if worker.qos:
        info["qos_level"] = worker.qos.lower()
    return info


def _upper_gpu_prefix(uuid: str) -> str:
    return "GPU-" + uuid[4:] if uuid.lower().startswith("gpu-") else uuid


def remote_pod_info(ctx: HypervisorContext, allocation: WorkerAllocation, container: str) -> JsonObject:
    """The RemotePodInfo the in-pod limiter reads from `GET /api/v1/pod`."""
    worker = allocation.worker
    uuids = worker.container_gpus.get(container) if container else None
    if not uuids:
        uuids = [d.uuid for d in allocation.devices] or list(worker.allocated_devices)
    info: JsonObject = {"pod_name": worker.name, "namespace": worker.namespace,
                        "gpu_uuids": [_upper_gpu_prefix(u) for u in uuids]}
    if worker.limits.tflops_milli:
        info["tflops_limit"] = worker.limits.tflops
    if worker.limits.vram_bytes:
        info["vram_limit"] = worker.limits.vram_bytes
    if worker.qos:
        info["qos_level"] = worker.qos.capitalize()
    info["compute_shard"] = False
    info["isolation"] = worker.isolation
    config = (orjson.dumps(ctx.scheduling.document()).decode() if ctx.scheduling is not None
              else ctx.settings.scheduling_config)
    freeze = auto_freeze_rule(config, worker.qos)
    if freeze is not None:
        info["auto_freeze"] = freeze
    return info


def auto_freeze_rule(scheduling_config: str, qos: str) -> JsonObject | None:
    """The `autoFreezeAndResume.autoFreeze[]` rule for a QoS from TF_HYPERVISOR_SCHEDULING_CONFIG."""
    if not scheduling_config.strip():
        return None
    try:
        config = orjson.loads(scheduling_config)
    except ValueError:
        return None
    rules = accessors.items(config, "autoFreezeAndResume", "autoFreeze")
    for rule in rules:
        if isinstance(rule, dict) and str(rule.get("qos", "")).lower() == qos.lower():
            result: JsonObject = {"enable": bool(rule.get("enable", False))}
            if rule.get("freezeToMemTTL"):
                result["freeze_to_mem_ttl"] = str(rule["freezeToMemTTL"])
            if rule.get("freezeToDiskTTL"):
                result["freeze_to_disk_ttl"] = str(rule["freezeToDiskTTL"])
            return result
    return None
