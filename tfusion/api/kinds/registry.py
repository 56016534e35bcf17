"""The 12 kinds of tensor-fusion.ai/v1: names, scope, status subresource and printer columns.

Why it exists: the CRD generator, the decoder, the controller's informers and the embedded API
server all need to know, per kind, its plural, short names and scope; one table serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from tfusion.api.kinds.base import Model
from tfusion.api.kinds.cluster import TensorFusionCluster
from tfusion.api.kinds.gpu import GPU
from tfusion.api.kinds.node import GPUNode
from tfusion.api.kinds.pool import GPUPool
from tfusion.api.kinds.provider import ProviderConfig
from tfusion.api.kinds.provisioning import GPUNodeClaim, GPUNodeClass
from tfusion.api.kinds.quota import GPUResourceQuota
from tfusion.api.kinds.scheduling import SchedulingConfigTemplate
from tfusion.api.kinds.workload import TensorFusionConnection, TensorFusionWorkload, WorkloadProfile

__all__ = ["KINDS", "KINDS_BY_PLURAL", "KindInfo", "PrinterColumn"]


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """An `additionalPrinterColumns` entry; `json_path` must exist in the kind's schema."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    priority: int = 0


@dataclass(frozen=True, slots=True)
class KindInfo:
    kind: str
    plural: str
    model: type[Model]
    short_names: tuple[str, ...] = ()
    namespaced: bool = False
    printer_columns: tuple[PrinterColumn, ...] = ()
    description: str = ""
    #: False where the kind has a `status` field that is NOT a subresource (ProviderConfig, as upstream)
    status_subresource: bool = True

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def scope(self) -> Literal["Namespaced", "Cluster"]:
        return "Namespaced" if self.namespaced else "Cluster"

    @property
    def has_status(self) -> bool:
        """Whether `status` is a subresource (written only through `/status`)."""
        return self.status_subresource and "status" in self.model.__struct_fields__


def _col(name: str, path: str, type_: Literal["string", "integer", "number", "boolean", "date"] = "string",
         priority: int = 0) -> PrinterColumn:
    return PrinterColumn(name, path, type_, priority)


_AGE: Final = _col("Age", ".metadata.creationTimestamp", "date")

_PROFILE_COLUMNS: Final = (
    _col("Pool Name", ".spec.poolName"),
    _col("QoS", ".spec.qos"),
    _col("Is Local GPU", ".spec.isLocalGPU", "boolean"),
    _col("GPU Number", ".spec.gpuCount", "integer"),
    _col("Replicas", ".spec.replicas", "integer"),
)

_KIND_LIST: Final[tuple[KindInfo, ...]] = (
    KindInfo("TensorFusionCluster", "tensorfusionclusters", TensorFusionCluster, ("tfc",),
             description="The TensorFusion installation: its GPU pools and cluster-wide capacity.",
             printer_columns=(
                 _col("Phase", ".status.phase"),
                 _col("Total Pools", ".status.totalPools", "integer"),
                 _col("Total Nodes", ".status.totalNodes", "integer"),
                 _col("Total GPU", ".status.totalGPUs", "integer"),
                 _col("Total Tflops", ".status.totalTFlops"),
                 _col("Total VRAM", ".status.totalVRAM"),
                 _col("Available Tflops", ".status.availableTFlops"),
                 _col("Available VRAM", ".status.availableVRAM"),
                 _AGE)),
    KindInfo("GPUPool", "gpupools", GPUPool, ("gp",),
             description="A pool of GPU nodes sharing capacity, isolation, QoS pricing and components.",
             printer_columns=(
                 _col("Phase", ".status.phase"),
                 _col("TFlops Oversubscription", ".spec.capacityConfig.oversubscription.tflopsOversellRatio",
                      "integer"),
                 _col("Mode", ".spec.nodeManagerConfig.provisioningMode"),
                 _col("Default Scheduling Strategy", ".spec.schedulingConfigTemplate"),
                 _col("Total Nodes", ".status.totalNodes", "integer"),
                 _col("Total GPU", ".status.totalGPUs", "integer"),
                 _col("Total Tflops", ".status.totalTFlops"),
                 _col("Total VRAM", ".status.totalVRAM"),
                 _col("Available Tflops", ".status.availableTFlops"),
                 _col("Available VRAM", ".status.availableVRAM"),
                 _AGE)),
    KindInfo("GPUNode", "gpunodes", GPUNode, ("gn",),
             description="A Kubernetes node with GPUs managed by TensorFusion (same name as the node).",
             printer_columns=(
                 _col("Phase", ".status.phase"),
                 _col("Total TFlops", ".status.totalTFlops"),
                 _col("Total VRAM", ".status.totalVRAM"),
                 _col("Virtual TFlops", ".status.virtualTFlops"),
                 _col("Virtual VRAM", ".status.virtualVRAM"),
                 _col("Available TFlops", ".status.availableTFlops"),
                 _col("Available VRAM", ".status.availableVRAM"),
                 _col("GPU Count", ".status.totalGPUs", "integer"),
                 _AGE)),
    KindInfo("GPU", "gpus", GPU, (),
             description="One GPU device, named by its UUID; reported by the node's hypervisor.",
             printer_columns=(
                 _col("GPU Model", ".status.gpuModel"),
                 _col("Phase", ".status.phase"),
                 _col("Total TFlops", ".status.capacity.tflops"),
                 _col("Total VRAM", ".status.capacity.vram"),
                 _col("Available TFlops", ".status.available.tflops"),
                 _col("Available VRAM", ".status.available.vram"),
                 _col("Device UUID", ".status.uuid"),
                 _col("Used By", ".status.usedBy"),
                 _col("Node", r".status.nodeSelector.kubernetes\.io/hostname"),
                 # pod UID -> template and slots of each hardware partition (kubectl get gpus -o wide)
                 _col("Partitions", ".status.allocatedPartitions", priority=1),
                 _AGE)),
    KindInfo("GPUNodeClass", "gpunodeclasses", GPUNodeClass, ("gnc",),
             description="A cloud VM template for provisioned GPU nodes.",
             printer_columns=(_AGE,)),
    KindInfo("GPUNodeClaim", "gpunodeclaims", GPUNodeClaim, ("gnclaim",),
             description="One GPU VM a pool wants a cloud vendor to create.",
             printer_columns=(_col("Phase", ".status.phase"), _AGE)),
    KindInfo("SchedulingConfigTemplate", "schedulingconfigtemplates", SchedulingConfigTemplate, ("sct",),
             description="Placement strategy, vertical scaling rules and hypervisor tuning for pools.",
             printer_columns=(
                 _col("Mode", ".spec.placement.mode"),
                 _col("Allow Local GPU", ".spec.placement.allowUsingLocalGPU", "boolean"),
                 _col("AutoFreeze", ".spec.hypervisor.autoFreezeAndResume.autoFreeze[*].enable"),
                 _AGE)),
    KindInfo("GPUResourceQuota", "gpuresourcequotas", GPUResourceQuota, ("gq",), namespaced=True,
             description="The GPU budget of one namespace.",
             printer_columns=(
                 _col("Requests TFlops Used", ".status.used.requests.tflops"),
                 _col("Requests VRAM Used", ".status.used.requests.vram"),
                 _col("Workers Used", ".status.used.workers", "integer"),
                 _col("Alert Threshold", ".spec.total.alertThresholdPercent", "integer"),
                 _AGE)),
    KindInfo("ProviderConfig", "providerconfigs", ProviderConfig, ("tfpc",), status_subresource=False,
             description="Vendor-specific images, hypervisor settings, GPU models and partition templates.",
             printer_columns=(_col("Vendor", ".spec.vendor"), _AGE)),
    KindInfo("TensorFusionWorkload", "tensorfusionworkloads", TensorFusionWorkload, ("tfw",), namespaced=True,
             description="The GPU request of one application and the state of its workers.",
             printer_columns=(
                 _col("Phase", ".status.phase"),
                 _col("Gang", ".status.gang.phase"),
                 _col("Worker Count", ".status.workerCount", "integer"),
                 _col("Ready Workers", ".status.readyWorkers", "integer"),
                 _col("Pod Template Hash", ".status.podTemplateHash", priority=1),
                 *_PROFILE_COLUMNS,
                 _AGE)),
    KindInfo("WorkloadProfile", "workloadprofiles", WorkloadProfile, ("wp",), namespaced=True,
             description="A reusable base spec for workloads, referenced from pod annotations.",
             printer_columns=(*_PROFILE_COLUMNS, _AGE)),
    KindInfo("TensorFusionConnection", "tensorfusionconnections", TensorFusionConnection, ("tfconn",),
             namespaced=True,
             description="Links a remote-mode client pod to the worker that serves it.",
             printer_columns=(
                 _col("Phase", ".status.phase"),
                 _col("Connection URL", ".status.connectionURL"),
                 _col("Worker Name", ".status.workerName"),
                 _col("Workload Name", ".spec.workloadName"),
                 _col("Client Pod", ".spec.clientPod"),
                 _AGE)),
)

#: kind name -> KindInfo, in a fixed order (the order of `tfusion crds`)
KINDS: Final[dict[str, KindInfo]] = {info.kind: info for info in _KIND_LIST}
KINDS_BY_PLURAL: Final[dict[str, KindInfo]] = {info.plural: info for info in _KIND_LIST}
