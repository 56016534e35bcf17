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

    spec_template: GPUPoolSpec
    """The spec of the GPUPool the controller creates (or updates) for this entry."""
    name: str = ""
    """Short pool name; the GPUPool is called <cluster>-<name>."""
    is_default: bool = False
    """Whether pods that name no pool use this one. Default false."""


class ComputingVendorParams(Model):
    default_region: str = ""
    """Cloud region used when a request names none."""
    access_key_path: str = ""
    """File path of the access key (accessKey auth)."""
    secret_key_path: str = ""
    """File path of the secret key (accessKey auth)."""
    iam_role: str = ""
    """Cloud IAM role to assume (serviceAccountRole auth)."""
    config_file: str = ""
    """Path of a vendor configuration file."""
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)
    """Further vendor-specific settings."""


class ComputingVendorConfig(Model):
    """The cloud API used to provision GPU nodes."""

    name: str = ""
    """Name of this vendor configuration."""
    type: CloudVendor | None = None
    """Cloud vendor: aws, lambda-labs, gcp, azure, oracle-oci, ibm, openshift, vultr, together-ai, alibaba, nvidia,
    tencent, runpod, karpenter or mock."""
    auth_type: Literal["accessKey", "serviceAccountRole"] | None = None
    """How the controller authenticates: accessKey or serviceAccountRole."""
    enable: bool = True
    """Whether provisioning through this vendor is on. Default true."""
    params: ComputingVendorParams | None = None
    """Region, credentials and vendor-specific settings."""


class TensorFusionClusterSpec(Model):
    gpu_pools: list[GPUPoolDefinition] = msgspec.field(default_factory=list, name="gpuPools")
    """The GPU pools of the cluster; each becomes a GPUPool."""
    computing_vendor: ComputingVendorConfig | None = None
    """Cloud API used to create GPU nodes for provisioned pools."""


class TensorFusionClusterStatus(Model):
    total_pools: Int32
    """Number of pools."""
    total_nodes: Int32
    """Number of GPU nodes in all pools."""
    total_gpus: Int32 = msgspec.field(name="totalGPUs")
    """Number of GPUs in all pools."""
    total_tflops: Quantity = msgspec.field(name="totalTFlops")
    """Physical compute of all pools in TFLOPS, a Kubernetes quantity."""
    total_vram: Quantity = msgspec.field(name="totalVRAM")
    """Physical GPU memory of all pools in bytes, a Kubernetes quantity."""
    virtual_tflops: Quantity = msgspec.field(name="virtualTFlops")
    """Compute after oversubscription in TFLOPS, a Kubernetes quantity."""
    virtual_vram: Quantity = msgspec.field(name="virtualVRAM")
    """Memory after expansion into host RAM and disk, bytes as a Kubernetes quantity."""
    available_tflops: Quantity = msgspec.field(name="availableTFlops")
    """Compute not yet reserved in TFLOPS, a Kubernetes quantity."""
    available_vram: Quantity = msgspec.field(name="availableVRAM")
    """GPU memory not yet reserved in bytes, a Kubernetes quantity."""
    phase: PoolPhase = "Pending"
    """Cluster phase: Pending, Running, Updating, Destroying or Unknown. Default Pending."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Latest observations of the cluster's state."""
    virtual_available_tflops: Quantity | None = msgspec.field(default=None, name="virtualAvailableTFlops")
    """Oversubscribed compute not yet reserved, a Kubernetes quantity."""
    virtual_available_vram: Quantity | None = msgspec.field(default=None, name="virtualAvailableVRAM")
    """Expanded memory not yet reserved, bytes as a Kubernetes quantity."""
    ready_gpu_pools: list[str] = msgspec.field(default_factory=list, name="readyGPUPools")
    """Names of the pools that are Running."""
    not_ready_gpu_pools: list[str] = msgspec.field(default_factory=list, name="notReadyGPUPools")
    """Names of the pools that are not Running."""
    retry_count: Annotated[Int64, DEFAULT_ZERO, REQUIRED] = 0
    """How many times the controller has retried reconciling the cluster. Default 0."""
    utilized_tflops_percent: str = msgspec.field(default="", name="utilizedTFlopsPercent")
    """Percent of compute in actual use, a decimal string."""
    utilized_vram_percent: str = msgspec.field(default="", name="utilizedVRAMPercent")
    """Percent of GPU memory in actual use, a decimal string."""
    allocated_tflops_percent: str = msgspec.field(default="", name="allocatedTFlopsPercent")
    """Percent of compute reserved, a decimal string."""
    allocated_vram_percent: str = msgspec.field(default="", name="allocatedVRAMPercent")
    """Percent of GPU memory reserved, a decimal string."""
    saved_costs_per_month: str = ""
    """Estimated monthly saving from sharing GPUs, a dollar string."""
    potential_savings_per_month: str = ""
    """Estimated further monthly saving, a dollar string."""
    cloud_vendor_config_hash: str = ""
    """Hash of the vendor configuration last applied; a change triggers re-provisioning."""


class TensorFusionCluster(Model):
    KIND: ClassVar[str] = "TensorFusionCluster"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("TensorFusionCluster"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TensorFusionClusterSpec = msgspec.field(default_factory=TensorFusionClusterSpec)
    """Pools and cloud vendor of the installation; written by an administrator (the Helm chart creates one)."""
    status: TensorFusionClusterStatus | None = None
    """Cluster-wide capacity and pool readiness; written by the controller."""
