"""Workers on this node and their allocations, in the original's JSON shape.

`WorkerInfo` and `WorkerAllocation` serialise with the Go field names the original uses
(`WorkerUID`, `AllocatedDevices`, `DeviceInfos`, `Envs`, ...), except `WorkerAmounts` (`tflops`,
`compute`, `vram` quantity strings) and `WorkerRunningInfo` (camelCase), which had JSON tags upstream.
The local backend persists exactly this shape in `workers.json`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tfusion.api import annotations as keys
from tfusion.api.quantity import Quantity
from tfusion.hypervisor.devices.model import DeviceInfo, DeviceWire, wire_map

STATUS_PENDING = "Pending"
STATUS_ALLOCATING = "DeviceAllocating"
STATUS_RUNNING = "Running"
STATUS_TERMINATED = "Terminated"

QOS_LEVELS = ("low", "medium", "high", "critical")
ISOLATION_MODES = keys.ISOLATION_MODES


class AmountsWire(TypedDict, total=False):
    """`WorkerAmounts` on the wire: quantity strings (the original had JSON tags here)."""

    tflops: str
    compute: str
    vram: str


class RunningWire(TypedDict, total=False):
    """`RunningInfo` on the wire; `processGroup` is only in the local backend's `workers.json`."""

    type: str
    executable: str
    args: list[str]
    env: dict[str, str]
    workingDir: str
    restarts: int
    pid: int
    isRunning: bool
    exitCode: int
    processGroup: dict[str, int]


class WorkerWire(TypedDict, total=False):
    """`WorkerInfo` with the original's Go field names (what `workers.json` holds, one per worker)."""

    WorkerUID: str
    Namespace: str
    WorkerName: str
    AllocatedDevices: list[str]
    Status: str
    QoS: str
    IsolationMode: str
    Requests: AmountsWire
    Limits: AmountsWire
    PartitionTemplateID: str
    WorkloadName: str
    WorkloadNamespace: str
    Labels: dict[str, str]
    Annotations: dict[str, str]
    WorkerRunningInfo: RunningWire | None
    DeletedAt: int


class AllocationWire(TypedDict):
    """`WorkerAllocation` with the original's Go field names."""

    WorkerInfo: WorkerWire
    DeviceInfos: list[DeviceWire]
    Envs: dict[str, str]
    Mounts: list[dict[str, str]]
    Devices: list[dict[str, str]]


@dataclass(frozen=True)
class WorkerAmounts:
    """A worker's per-GPU TFLOPS (milli), compute percent and VRAM bytes; zero means "not set"."""

    tflops_milli: int = 0
    compute_percent: float = 0.0
    vram_bytes: int = 0

    def to_wire(self) -> AmountsWire:
        return {"tflops": str(Quantity.from_milli(self.tflops_milli)),
                "compute": _percent_text(self.compute_percent),
                "vram": str(Quantity.from_int(self.vram_bytes, "BinarySI"))}

    @classmethod
    def from_wire(cls, raw: AmountsWire | None) -> WorkerAmounts:
        raw = raw or AmountsWire()
        return cls(tflops_milli=Quantity.parse(raw.get("tflops") or "0").milli_value(),
                   compute_percent=float(Quantity.parse(raw.get("compute") or "0").decimal),
                   vram_bytes=Quantity.parse(raw.get("vram") or "0").value())

    @property
    def tflops(self) -> float:
        return self.tflops_milli / 1000.0


def _percent_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass
class RunningInfo:
    """A supervised process worker (local backend): what to run and how it is doing."""

    executable: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    restarts: int = 0
    pid: int = 0
    is_running: bool = False
    exit_code: int | None = None

    def to_wire(self) -> RunningWire:
        return {"type": "process", "executable": self.executable, "args": list(self.args), "env": dict(self.env),
                "workingDir": self.working_dir, "restarts": self.restarts, "pid": self.pid,
                "isRunning": self.is_running, "exitCode": self.exit_code if self.exit_code is not None else 0}

    @classmethod
    def from_wire(cls, raw: RunningWire) -> RunningInfo:
        return cls(executable=str(raw.get("executable", "")), args=[str(a) for a in raw.get("args") or []],
                   env={str(k): str(v) for k, v in wire_map(raw.get("env")).items()},
                   working_dir=str(raw.get("workingDir", "")), restarts=int(raw.get("restarts", 0)))


@dataclass(frozen=True)
class WorkerInfo:
    """One worker (a pod in Kubernetes mode, a named entry in local mode)."""

    uid: str
    namespace: str
    name: str
    allocated_devices: tuple[str, ...] = ()
    status: str = STATUS_PENDING
    qos: str = "medium"
    isolation: str = keys.DEFAULT_ISOLATION
    requests: WorkerAmounts = field(default_factory=WorkerAmounts)
    limits: WorkerAmounts = field(default_factory=WorkerAmounts)
    partition_template_id: str = ""
    workload_name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    container_gpus: dict[str, list[str]] = field(default_factory=dict)
    effective_hard_sm_percent: int | None = None
    deleted_at: int = 0
    #: the user all of the pod's containers run as and a group they all have (fsGroup, or a shared
    #: runAsGroup), from its securityContext; None when the pod does not say. Who, besides root, may
    #: open the files the hypervisor shares with the pod (its shared memory).
    run_as_user: int | None = None
    shared_group: int | None = None

    def replace(self, **changes: Any) -> WorkerInfo:
        return dataclasses.replace(self, **changes)

    def to_wire(self, running: RunningInfo | None = None) -> WorkerWire:
        return {
            "WorkerUID": self.uid, "Namespace": self.namespace, "WorkerName": self.name,
            "AllocatedDevices": list(self.allocated_devices), "Status": self.status, "QoS": self.qos,
            "IsolationMode": self.isolation, "Requests": self.requests.to_wire(), "Limits": self.limits.to_wire(),
            "PartitionTemplateID": self.partition_template_id, "WorkloadName": self.workload_name,
            "WorkloadNamespace": self.namespace, "Labels": dict(self.labels),
            "Annotations": dict(self.annotations),
            "WorkerRunningInfo": running.to_wire() if running else None, "DeletedAt": self.deleted_at,
        }

    @classmethod
    def from_wire(cls, raw: WorkerWire) -> WorkerInfo:
        return cls(
            uid=str(raw["WorkerUID"]), namespace=str(raw.get("Namespace", "")), name=str(raw.get("WorkerName", "")),
            allocated_devices=tuple(str(d) for d in raw.get("AllocatedDevices") or ()),
            status=str(raw.get("Status", STATUS_PENDING)), qos=str(raw.get("QoS", "medium")),
            isolation=str(raw.get("IsolationMode", keys.DEFAULT_ISOLATION)),
            requests=WorkerAmounts.from_wire(raw.get("Requests")),
            limits=WorkerAmounts.from_wire(raw.get("Limits")),
            partition_template_id=str(raw.get("PartitionTemplateID", "")),
            workload_name=str(raw.get("WorkloadName", "")), labels=wire_map(raw.get("Labels")),
            annotations=wire_map(raw.get("Annotations")), deleted_at=int(raw.get("DeletedAt", 0)))


@dataclass(frozen=True)
class WorkerAllocation:
    """What a worker got: its devices, the env that pins them and its limits, mounts and device nodes."""

    worker: WorkerInfo
    devices: tuple[DeviceInfo, ...]
    envs: dict[str, str]
    mounts: tuple[dict[str, str], ...] = ()
    device_specs: tuple[dict[str, str], ...] = ()

    def to_wire(self, *, isolation_mode: str = "", isolation_policy: str = "",
                running: RunningInfo | None = None) -> AllocationWire:
        return {
            "WorkerInfo": self.worker.to_wire(running),
            "DeviceInfos": [d.to_wire(isolation_mode, isolation_policy) for d in self.devices],
            "Envs": dict(self.envs),
            "Mounts": [dict(m) for m in self.mounts],
            "Devices": [dict(d) for d in self.device_specs],
        }
