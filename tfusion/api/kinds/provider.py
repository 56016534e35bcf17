"""ProviderConfig: everything vendor-specific (images, hypervisor mounts, GPU models, partitions).

Why it exists: one object per hardware vendor (NVIDIA, Ascend, …) tells the controller which
images to inject, which native resource names to strip, and each GPU model's TFLOPs, price and
partition templates.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import API_VERSION, Int32, Model, Quantity, UInt32, constant
from tfusion.api.kinds.meta import ObjectMeta

__all__ = [
    "DeviceMount", "DevicePluginDetection", "EnvVar", "HardwareModelInfo", "HostPathMount", "ProviderConfig",
    "ProviderConfigSpec", "ProviderHypervisor", "ProviderImages", "VirtualizationTemplate",
]


class ProviderImages(Model):
    middleware: str
    remote_client: str = ""
    remote_worker: str = ""


class EnvVar(Model):
    name: str
    value: str = ""


class HostPathMount(Model):
    name: str
    host_path: str
    mount_path: str
    read_only: bool = False


class DeviceMount(Model):
    """Which host devices a worker gets: CEL rules over each device, plus devices every worker shares."""

    device_mount_rule: str = ""
    partitioned_device_mount_rule: str = ""
    shared_devices: list[str] = msgspec.field(default_factory=list)


class ProviderHypervisor(Model):
    privileged_hypervisor: bool = False
    ld_library_path: str = ""
    extra_env: list[EnvVar] = msgspec.field(default_factory=list)
    host_path_mounts: list[HostPathMount] = msgspec.field(default_factory=list)
    device_mount: DeviceMount | None = None


class HardwareModelInfo(Model):
    """One GPU model: FP16 TFLOPs, hourly price and the partition templates it supports."""

    model: str
    full_model_name: str
    fp16_tflops: Quantity = msgspec.field(name="fp16TFlops")
    cost_per_hour: str = ""
    max_partitions: UInt32 = 0
    max_placement_slots: UInt32 = 0
    max_isolation_groups: UInt32 = 0
    total_extended_resources: dict[str, UInt32] = msgspec.field(default_factory=dict)
    partition_template_refs: list[str] = msgspec.field(default_factory=list)
    device_mount: DeviceMount | None = None


class VirtualizationTemplate(Model):
    """A partition profile (a MIG profile, an Ascend vNPU template, …)."""

    id: str
    name: str
    memory_gigabytes: Annotated[int, msgspec.Meta(ge=0, extra={"format": "int64"})]
    compute_percent: str
    nvml_profile_id: Int32 | None = msgspec.field(default=None, name="nvmlProfileId")
    description: str = ""
    max_instances: UInt32 = 0
    placement_limit: list[UInt32] = msgspec.field(default_factory=list)
    placement_offset: UInt32 = 0
    extended_resources: dict[str, UInt32] = msgspec.field(default_factory=dict)
    isolation_group_sharing: Literal["exclusive", "shared"] = "exclusive"
    max_partitions_per_isolation_group: UInt32 = 0
    isolation_group_slots: UInt32 = 0


class DevicePluginDetection(Model):
    resource_name_prefixes: list[str] = msgspec.field(default_factory=list)
    used_by_system_name: str = ""


class ProviderConfigSpec(Model):
    vendor: str
    images: ProviderImages
    hypervisor: ProviderHypervisor | None = None
    hardware_metadata: list[HardwareModelInfo] = msgspec.field(default_factory=list)
    virtualization_templates: list[VirtualizationTemplate] = msgspec.field(default_factory=list)
    in_use_resource_names: list[str] = msgspec.field(default_factory=list)
    device_plugin_detection: DevicePluginDetection | None = None


class ProviderConfig(Model):
    KIND: ClassVar[str] = "ProviderConfig"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("ProviderConfig"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ProviderConfigSpec | None = None
