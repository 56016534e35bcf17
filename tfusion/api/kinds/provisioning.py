"""GPUNodeClass and GPUNodeClaim: cloud VM templates and single VMs to create (advanced).

Why it exists: pools in Provisioned mode create nodes through a cloud vendor; the class says how
a VM is launched, the claim says which VM one pool wants.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import API_VERSION, Int32, Model, Quantity, constant
from tfusion.api.kinds.common import GroupKindName
from tfusion.api.kinds.meta import ObjectMeta

__all__ = [
    "BlockDeviceMapping", "EBSVolume", "GPUNodeClaim", "GPUNodeClaimSpec", "GPUNodeClaimStatus",
    "GPUNodeClass",
    "GPUNodeClassSpec", "GPUNodeClassStatus", "LaunchTemplate", "MetadataOptions", "SelectorTerm",
]


class LaunchTemplate(Model):
    id: str = ""
    name: str = ""
    tags: dict[str, str] = msgspec.field(default_factory=dict)


class SelectorTerm(Model):
    """Selects cloud objects (images, security groups, subnets) by id, name or tags."""

    id: str = ""
    name: str = ""
    tags: dict[str, str] = msgspec.field(default_factory=dict)


class MetadataOptions(Model):
    http_endpoint: bool = True
    http_protocol_ipv6: bool = msgspec.field(default=False, name="httpProtocolIPv6")
    http_put_response_hop_limit: int = 1
    http_tokens: str = "required"


class EBSVolume(Model):
    volume_size: str = ""
    volume_type: str = ""
    delete_on_termination: bool = True
    encrypted: bool = True


class BlockDeviceMapping(Model):
    device_name: str = ""
    ebs: EBSVolume | None = None


class GPUNodeClassSpec(Model):
    launch_template: LaunchTemplate | None = None
    os_image_type: Literal["Private", "Public", "System"] = "Private"
    os_image_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    instance_profile: str = ""
    metadata_options: MetadataOptions | None = None
    security_group_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    subnet_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    block_device_mappings: list[BlockDeviceMapping] = msgspec.field(default_factory=list)
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    user_data: str = ""


class GPUNodeClassStatus(Model):
    """Empty: a node class has no observed state."""


class GPUNodeClass(Model):
    KIND: ClassVar[str] = "GPUNodeClass"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNodeClass"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeClassSpec = msgspec.field(default_factory=GPUNodeClassSpec)
    status: GPUNodeClassStatus = msgspec.field(default_factory=GPUNodeClassStatus)


class GPUNodeClaimSpec(Model):
    tflops_offered: Quantity = msgspec.field(name="tflopsOffered")
    vram_offered: Quantity = msgspec.field(name="vramOffered")
    gpu_device_offered: Int32 = msgspec.field(name="gpuDeviceOffered")
    node_name: str = ""
    region: str = ""
    zone: str = ""
    instance_type: str = ""
    node_class_ref: GroupKindName | None = None
    capacity_type: Literal["OnDemand", "Reserved", "Spot"] | None = None
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)


class GPUNodeClaimStatus(Model):
    phase: Literal["Pending", "Creating", "Bound"] = "Pending"
    instance_id: str = msgspec.field(default="", name="instanceID")


class GPUNodeClaim(Model):
    KIND: ClassVar[str] = "GPUNodeClaim"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNodeClaim"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeClaimSpec | None = None
    status: GPUNodeClaimStatus = msgspec.field(default_factory=GPUNodeClaimStatus)
