"""ProviderConfig: everything vendor-specific (images, hypervisor mounts, GPU models, partitions).

Why it exists: one object per hardware vendor (NVIDIA, Ascend, …) tells the controller which
images to inject, which native resource names to strip, and each GPU model's TFLOPs, price and
partition templates.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import API_VERSION, Int32, Int64, Model, Quantity, UInt32, constant
from tfusion.api.kinds.meta import ObjectMeta

__all__ = [
    "DeviceMount", "DevicePluginDetection", "EnvVar", "HardwareModelInfo", "HostPathMount", "ProviderConfig",
    "ProviderConfigSpec", "ProviderConfigStatus", "ProviderHypervisor", "ProviderImages", "VirtualizationTemplate",
]


class ProviderImages(Model):
    middleware: str
    """Image of the vendor middleware injected into local-GPU pods."""
    remote_client: str = ""
    """Client image for remote vGPU mode on this vendor."""
    remote_worker: str = ""
    """Worker image for remote vGPU mode on this vendor."""


class EnvVar(Model):
    name: str
    """Environment variable name."""
    value: str = ""
    """Environment variable value."""


class HostPathMount(Model):
    name: str
    """Volume name."""
    host_path: str
    """Path on the host."""
    mount_path: str
    """Path inside the hypervisor container."""
    read_only: bool = False
    """Mount read-only. Default false."""


class DeviceMount(Model):
    """Which host devices a worker gets: CEL rules over each device, plus devices every worker shares."""

    device_mount_rule: str = ""
    """CEL expression choosing which host device files a worker gets."""
    partitioned_device_mount_rule: str = ""
    """CEL expression choosing device files for a partitioned worker."""
    shared_devices: list[str] = msgspec.field(default_factory=list)
    """Device files every worker gets (for example control devices)."""


class ProviderHypervisor(Model):
    privileged_hypervisor: bool = False
    """Run the hypervisor container privileged. Default false."""
    ld_library_path: str = ""
    """LD_LIBRARY_PATH for the vendor's driver libraries in the hypervisor."""
    extra_env: list[EnvVar] = msgspec.field(default_factory=list)
    """Extra environment variables of the hypervisor."""
    host_path_mounts: list[HostPathMount] = msgspec.field(default_factory=list)
    """Host directories mounted into the hypervisor."""
    device_mount: DeviceMount | None = None
    """Which device files workers get on this vendor's nodes."""


class HardwareModelInfo(Model):
    """One GPU model: FP16 TFLOPs, hourly price and the partition templates it supports."""

    model: str
    """Short model name (matches GPU status.gpuModel), for example A100."""
    full_model_name: str
    """Model name as the driver reports it."""
    fp16_tflops: Quantity = msgspec.field(name="fp16TFlops")
    """Dense FP16 compute of one device in TFLOPS, a Kubernetes quantity such as 312."""
    cost_per_hour: str = ""
    """Hourly price of one device, a dollar string."""
    max_partitions: UInt32 = 0
    """Most hardware partitions one device supports; 0 when it cannot be partitioned."""
    max_placement_slots: UInt32 = 0
    """Number of placement slots partitions are laid out in."""
    max_isolation_groups: UInt32 = 0
    """Number of isolation groups a device has."""
    total_extended_resources: dict[str, UInt32] = msgspec.field(default_factory=dict)
    """Device-wide budget of vendor resources (name to amount) partitions draw from."""
    partition_template_refs: list[str] = msgspec.field(default_factory=list)
    """IDs of the virtualizationTemplates this model supports."""
    device_mount: DeviceMount | None = None
    """Device mount rules for this model, overriding the vendor's."""


class VirtualizationTemplate(Model):
    """A partition profile (a MIG profile, an Ascend vNPU template, …)."""

    id: str
    """Template ID referenced by workloads (partitionTemplateId) and hardwareMetadata."""
    name: str
    """Display name (for example 1g.10gb)."""
    memory_gigabytes: Int64
    """Memory of one partition in GB."""
    compute_percent: str
    """Share of the device's compute, a decimal percent string such as "14.28"."""
    nvml_profile_id: Int32 | None = msgspec.field(default=None, name="nvmlProfileId")
    """NVML GPU-instance profile ID for MIG."""
    description: str = ""
    """Free text about the template."""
    max_instances: UInt32 = 0
    """Most partitions of this template on one device."""
    placement_limit: list[UInt32] = msgspec.field(default_factory=list)
    """Placement slots a partition of this template may start at."""
    placement_offset: UInt32 = 0
    """Number of slots one partition occupies."""
    extended_resources: dict[str, UInt32] = msgspec.field(default_factory=dict)
    """Vendor resources (name to amount) one partition consumes."""
    isolation_group_sharing: Literal["exclusive", "shared"] = "exclusive"
    """Whether a partition owns its isolation group (exclusive) or shares it (shared). Default exclusive."""
    max_partitions_per_isolation_group: UInt32 = 0
    """Most partitions sharing one isolation group."""
    isolation_group_slots: UInt32 = 0
    """Slots of an isolation group this template uses."""


class DevicePluginDetection(Model):
    resource_name_prefixes: list[str] = msgspec.field(default_factory=list)
    """Prefixes of native device-plugin resource names (for example nvidia.com/gpu) that mark a GPU as used by the
    plugin."""
    used_by_system_name: str = ""
    """Value written to GPU status.usedBy for such GPUs."""


class ProviderConfigSpec(Model):
    vendor: str
    """Hardware vendor this config is for (for example NVIDIA)."""
    images: ProviderImages
    """Vendor images injected into pods."""
    hypervisor: ProviderHypervisor | None = None
    """Hypervisor settings for this vendor."""
    hardware_metadata: list[HardwareModelInfo] = msgspec.field(default_factory=list)
    """Catalogue of GPU models: compute, price, partitioning."""
    virtualization_templates: list[VirtualizationTemplate] = msgspec.field(default_factory=list)
    """Hardware partition profiles (MIG and similar)."""
    in_use_resource_names: list[str] = msgspec.field(default_factory=list)
    """Native resource names (such as nvidia.com/gpu) the webhook removes from pods it takes over."""
    device_plugin_detection: DevicePluginDetection | None = None
    """How GPUs already given out by the vendor's device plugin are recognised."""


class ProviderConfigStatus(Model):
    """Empty: a provider config has no observed state (and, as upstream, no status subresource)."""


class ProviderConfig(Model):
    KIND: ClassVar[str] = "ProviderConfig"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("ProviderConfig"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ProviderConfigSpec | None = None
    """Vendor-specific settings; written by an administrator (the Helm chart creates the NVIDIA one)."""
    status: ProviderConfigStatus = msgspec.field(default_factory=ProviderConfigStatus)
    """Empty; a provider config has no observed state."""
