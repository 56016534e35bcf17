"""TensorFusionCluster: the top-level object; it owns the GPU pools and sums up their capacity.

Why it exists: users declare pools once in the cluster (`gpuPools[].specTemplate`) and the
controller generates one GPUPool per entry; the status is the cluster-wide capacity report.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import API_VERSION, DEFAULT_ZERO, REQUIRED, Int32, Int64, Model, Quantity, constant
from tfusion.api.kinds.meta import Condition, ObjectMeta
from tfusion.api.kinds.pool import GPUPoolSpec, PoolPhase

__all__ = [
    "ComputingVendorConfig", "ComputingVendorParams", "GPUPoolDefinition", "TensorFusionCluster",
    "TensorFusionClusterSpec", "TensorFusionClusterStatus",
]

CloudVendor = Literal[
    "aws", "lambda-labs", "gcp", "azure", "oracle-oci", "ibm", "openshift", "vultr", "together-ai", "alibaba",
    "nvidia", "tencent", "runpod", "karpenter", "mock",
]


class GPUPoolDefinition(Model):
    """One pool of the cluster; the controller creates GPUPool `<cluster>-<name>` from it."""

    name: str
    spec_template: GPUPoolSpec
    is_default: bool = False


class ComputingVendorParams(Model):
    default_region: str = ""
    access_key_path: str = ""
    secret_key_path: str = ""
    iam_role: str = ""
    config_file: str = ""
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)


class ComputingVendorConfig(Model):
    """The cloud API used to provision GPU nodes."""

    name: str = ""
    type: CloudVendor | None = None
    auth_type: Literal["accessKey", "serviceAccountRole"] | None = None
    enable: bool = True
    params: ComputingVendorParams | None = None


class TensorFusionClusterSpec(Model):
    gpu_pools: list[GPUPoolDefinition] = msgspec.field(default_factory=list, name="gpuPools")
    computing_vendor: ComputingVendorConfig | None = None


class TensorFusionClusterStatus(Model):
    total_pools: Int32
    total_nodes: Int32
    total_gpus: Int32 = msgspec.field(name="totalGPUs")
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    virtual_tflops: Quantity = msgspec.field(name="virtualTFlops")
    virtual_vram: Quantity = msgspec.field(name="virtualVRAM")
    available_tflops: Quantity = msgspec.field(name="availableTFlops")
    available_vram: Quantity = msgspec.field(name="availableVRAM")
    phase: PoolPhase = "Pending"
    conditions: list[Condition] = msgspec.field(default_factory=list)
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    ready_gpu_pools: list[str] = msgspec.field(default_factory=list, name="readyGPUPools")
    not_ready_gpu_pools: list[str] = msgspec.field(default_factory=list, name="notReadyGPUPools")
    retry_count: Annotated[Int64, DEFAULT_ZERO, REQUIRED] = 0
    utilized_tflops_percent: str = msgspec.field(default="", name="utilizedTFlopsPercent")
    utilized_vram_percent: str = msgspec.field(default="", name="utilizedVRAMPercent")
    allocated_tflops_percent: str = msgspec.field(default="", name="allocatedTFlopsPercent")
    allocated_vram_percent: str = msgspec.field(default="", name="allocatedVRAMPercent")
    saved_costs_per_month: str = ""
    potential_savings_per_month: str = ""
    cloud_vendor_config_hash: str = ""


class TensorFusionCluster(Model):
    KIND: ClassVar[str] = "TensorFusionCluster"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionCluster"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TensorFusionClusterSpec = msgspec.field(default_factory=TensorFusionClusterSpec)
    status: TensorFusionClusterStatus | None = None
