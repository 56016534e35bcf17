"""The request and response bodies of the hypervisor's HTTP API, as msgspec Structs.

They exist so that `/schema/openapi.json` describes every body, and so that an answer is checked
against its declared shape before it leaves. The JSON keys are the original's: its envelopes use
snake_case, its DeviceInfo, WorkerAllocation, WorkerInfo and WorkerMetrics use Go field names, so
each field is given its wire name explicitly. The models' `to_wire` dicts are converted into
these Structs with `forbid_unknown_fields`, so a key added there without being declared here
fails in tests instead of silently leaving the answer.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.openapi.spec import OpenAPIType
from msgspec import UNSET, UnsetType

from tfusion.hypervisor.workers.model import ISOLATION_MODES, QOS_LEVELS
from tfusion.web import ErrorBody

#: a number exactly as the model computed it (989 stays 989, not 989.0). Documented as one JSON
#: Schema `number`: `oneOf: [integer, number]` would match 200.0 twice (JSON Schema counts a number
#: with no fraction as an integer), so a valid answer would fail its own document.
Number = Annotated[int | float, msgspec.Meta(extra_json_schema={"extra": {"type": OpenAPIType.NUMBER,
                                                                          "one_of": None}})]
#: a DNS label, as a worker's name and namespace must be (`workers/spec.py` checks the same)
DNS_LABEL = msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
#: a non-negative Kubernetes quantity as a string ("100", "1500m", "8Gi", "1e3")
QUANTITY = msgspec.Meta(pattern=r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


def wire(name: str, default: Any = msgspec.NODEFAULT) -> Any:
    """A Struct field whose JSON key is `name`."""
    return msgspec.field(name=name, default=default)


def _about(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class Wire(msgspec.Struct, forbid_unknown_fields=True):
    """Base of the bodies: converting a dict with a key the Struct does not declare is an error."""


# --- devices -------------------------------------------------------------------------------------

class Capabilities(Wire):
    supports_partitioning: bool = wire("SupportsPartitioning")
    supports_soft_isolation: bool = wire("SupportsSoftIsolation")
    supports_hard_isolation: bool = wire("SupportsHardIsolation")
    supports_snapshot: bool = wire("SupportsSnapshot")
    supports_metrics: bool = wire("SupportsMetrics")
    supports_remoting: bool = wire("SupportsRemoting")
    max_partitions: int = wire("MaxPartitions")
    max_workers_per_device: int = wire("MaxWorkersPerDevice")


class Device(Wire):
    """One accelerator (the original's DeviceInfo)."""

    uuid: Annotated[str, _about("Lowercase device UUID, the key of /api/v1/devices/{uuid}")] = wire("UUID")
    vendor: str = wire("Vendor")
    model: str = wire("Model")
    index: int = wire("Index")
    numa_node: Annotated[int, _about("-1 when unknown")] = wire("NUMANode")
    topology: dict[str, Any] | None = wire("Topology")
    total_memory_bytes: int = wire("TotalMemoryBytes")
    max_tflops: Annotated[Number, _about("Peak dense FP16 TFLOPS")] = wire("MaxTflops")
    capabilities: Capabilities = wire("VirtualizationCapabilities")
    properties: Annotated[dict[str, str], _about(
        "driverVersion, computeCapability, pciBusId, totalComputeUnits, healthMessage, ...")] = wire("Properties")
    healthy: bool = wire("Healthy")
    parent_uuid: str = wire("ParentUUID")
    device_node: dict[str, str] = wire("DeviceNode")
    device_env: dict[str, str] = wire("DeviceEnv")
    isolation_mode: str = wire("IsolationMode")
    isolation_policy: str = wire("IsolationPolicy")


class DeviceList(Wire):
    data: list[Device]


class DeviceAnswer(Wire):
    data: Device


class DiscoveryResult(Wire):
    status: Annotated[str, _about("Always \"Device discovery triggered\"")]
    devices: Annotated[int, _about("How many devices are known after the discovery")]
    added: list[str]
    removed: list[str]


# --- workers -------------------------------------------------------------------------------------

class ResourceAmounts(Wire):
    """Kubernetes quantities as strings."""

    tflops: str
    compute: Annotated[str, _about("Percent of one device")]
    vram: str


class RunningProcess(Wire):
    """A supervised process worker (local backend)."""

    type: str
    executable: str
    args: list[str]
    env: dict[str, str]
    working_dir: str = wire("workingDir")
    restarts: int = wire("restarts")
    pid: int = wire("pid")
    is_running: bool = wire("isRunning")
    exit_code: int = wire("exitCode")


class WorkerInfo(Wire):
    worker_uid: str = wire("WorkerUID")
    namespace: str = wire("Namespace")
    worker_name: str = wire("WorkerName")
    allocated_devices: list[str] = wire("AllocatedDevices")
    status: str = wire("Status")
    qos: str = wire("QoS")
    isolation_mode: str = wire("IsolationMode")
    requests: ResourceAmounts = wire("Requests")
    limits: ResourceAmounts = wire("Limits")
    partition_template_id: str = wire("PartitionTemplateID")
    workload_name: str = wire("WorkloadName")
    workload_namespace: str = wire("WorkloadNamespace")
    labels: dict[str, str] = wire("Labels")
    annotations: dict[str, str] = wire("Annotations")
    running_info: RunningProcess | None = wire("WorkerRunningInfo")
    deleted_at: int = wire("DeletedAt")


class WorkerAllocation(Wire):
    """What a worker got (the original's WorkerAllocation)."""

    worker_info: WorkerInfo = wire("WorkerInfo")
    device_infos: list[Device] = wire("DeviceInfos")
    envs: Annotated[dict[str, str], _about("The environment that pins the worker to its devices")] = wire("Envs")
    mounts: list[dict[str, str]] = wire("Mounts")
    devices: list[dict[str, str]] = wire("Devices")


class WorkerMetrics(Wire):
    device_uuid: str = wire("DeviceUUID")
    worker_uid: str = wire("WorkerUID")
    process_id: str = wire("ProcessID")
    memory_bytes: int = wire("MemoryBytes")
    memory_percentage: Number = wire("MemoryPercentage")
    compute_percentage: Number = wire("ComputePercentage")
    compute_tflops: Number = wire("ComputeTflops")
    extra_metrics: dict[str, Any] = wire("ExtraMetrics")


class WorkerList(Wire):
    data: list[WorkerAllocation]


class WorkerDetail(Wire):
    worker_uid: str
    allocation: WorkerAllocation
    metrics: Annotated[dict[str, dict[str, WorkerMetrics]], _about("device UUID -> host PID -> usage")]


class WorkerDetailAnswer(Wire):
    data: WorkerDetail


class WorkerCreated(Wire):
    data: WorkerAllocation


class WorkerReleased(Wire):
    worker_uid: str
    released: Annotated[list[str], _about("UUIDs of the devices the worker held")]


class WorkerReleasedAnswer(Wire):
    data: WorkerReleased


Amount = Annotated[str, QUANTITY] | Annotated[float, msgspec.Meta(ge=0)]


class WorkerResources(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    tflops: Annotated[Amount, _about("TFLOPS, a Kubernetes quantity such as 20 or 1500m")] | UnsetType = UNSET
    vram: Annotated[Amount, _about("Bytes, a Kubernetes quantity such as 8Gi")] | UnsetType = UNSET
    compute_percent: Annotated[Amount, _about("Percent of one device; instead of tflops")] | UnsetType = UNSET


def _one_of(choices: list[str]) -> msgspec.Meta:
    return msgspec.Meta(description=f"One of {', '.join(choices)}", extra_json_schema={"extra": {"enum": choices}})


LOCAL_ISOLATIONS = [m for m in ISOLATION_MODES if m != "partitioned"]


class WorkerCreateRequest(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """A local worker (`--backend=local`): what it asks for and, optionally, the process to run.
    What the schema cannot say is checked too (422): limits below requests, a gpuCount beyond this
    node's devices, gpuIds that are not this node's, both gpuCount and gpuIds."""

    name: Annotated[str, DNS_LABEL, _about("A DNS label, unique per namespace")]
    namespace: Annotated[str, DNS_LABEL] = "default"
    requests: WorkerResources | UnsetType = UNSET
    limits: WorkerResources | UnsetType = UNSET
    gpu_count: Annotated[int, msgspec.Meta(ge=1), _about(
        "How many devices, at most this node's; not with gpuIds")] | UnsetType = UNSET
    gpu_ids: Annotated[list[str], msgspec.Meta(min_length=1), _about(
        "UUIDs of this node's devices; not with gpuCount")] | UnsetType = UNSET
    isolation: Annotated[str, _one_of(LOCAL_ISOLATIONS)] = "soft"
    qos: Annotated[str, _one_of(list(QOS_LEVELS))] = "medium"
    command: Annotated[list[str] | str, _about("argv, or a command line split as a shell would")] | UnsetType = UNSET
    env: dict[str, str] | UnsetType = UNSET
    working_dir: str = ""
    labels: dict[str, str] | UnsetType = UNSET
    annotations: dict[str, str] | UnsetType = UNSET


class PlacementErrorBody(ErrorBody):
    """ErrorBody of the worker routes: when a worker does not fit, what is free and why not."""

    free: Annotated[list[dict[str, Any]], _about(
        "Per device: uuid, index, model, phase, available and capacity TFLOPS/VRAM")] | UnsetType = UNSET
    reasons: list[str] | UnsetType = UNSET


# --- limiter routes ------------------------------------------------------------------------------

class LimiterEntry(Wire):
    worker_uid: str
    requests: ResourceAmounts
    limits: ResourceAmounts


class LimiterList(Wire):
    limiters: list[LimiterEntry]


class TrapResult(Wire):
    message: str
    snapshot_count: Annotated[int, _about("Workers of QoS low or medium")]


class LegacyPod(Wire):
    pod_name: str
    namespace: str
    gpu_uuids: list[str]
    tflops_limit: Number | UnsetType = UNSET
    vram_limit: Annotated[int, _about("Bytes")] | UnsetType = UNSET
    qos_level: Annotated[str, _about("Lowercase")] | UnsetType = UNSET


class LegacyPods(Wire):
    """`GET /api/v1/pod` without a token or container_name: every worker with an allocation on this
    node, for troubleshooting (not authenticated, like /api/v1/workers)."""

    pods: list[LegacyPod]


class AutoFreeze(Wire):
    enable: bool
    freeze_to_mem_ttl: str | UnsetType = UNSET
    freeze_to_disk_ttl: str | UnsetType = UNSET


class RemotePodInfo(Wire):
    """What the in-pod limiter reads about its own pod."""

    pod_name: str
    namespace: str
    gpu_uuids: Annotated[list[str], _about("Upper-case GPU- prefix")]
    tflops_limit: Number | UnsetType = UNSET
    vram_limit: Annotated[int, _about("Bytes")] | UnsetType = UNSET
    qos_level: Annotated[str, _about("PascalCase")] | UnsetType = UNSET
    compute_shard: bool = False
    isolation: str = ""
    auto_freeze: AutoFreeze | UnsetType = UNSET


class RemotePodAnswer(Wire):
    """`GET /api/v1/pod` with the caller's token: its own pod (`data` null when its shared memory
    could not be prepared; `message` says why)."""

    success: bool
    data: RemotePodInfo | None
    message: str


class ProcessInfo(Wire):
    host_pid: int
    container_pid: int
    container_name: str
    pod_name: str
    namespace: str


class ProcessAnswer(Wire):
    """200 even when the process is not found (`success: false`), as the original."""

    success: bool
    message: str
    data: ProcessInfo | None
