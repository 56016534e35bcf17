"""GPUNodeClass and GPUNodeClaim: cloud VM templates and single VMs to create (advanced).

Why it exists: pools in Provisioned mode create nodes through a cloud vendor; the class says how
a VM is launched, the claim says which VM one pool wants.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from tfusion.api.kinds.base import API_VERSION, DEFAULT_FALSE, REQUIRED, Int32, Model, Quantity, constant
from tfusion.api.kinds.common import GroupKindName
from tfusion.api.kinds.meta import ObjectMeta

__all__ = [
    "BlockDeviceMapping", "EBSVolume", "GPUNodeClaim", "GPUNodeClaimSpec", "GPUNodeClaimStatus",
    "GPUNodeClass",
    "GPUNodeClassSpec", "GPUNodeClassStatus", "LaunchTemplate", "MetadataOptions", "SelectorTerm",
]


class LaunchTemplate(Model):
    id: str = ""
    """Cloud launch template ID."""
    name: str = ""
    """Cloud launch template name."""
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    """Tags selecting the launch template."""


class SelectorTerm(Model):
    """Selects cloud objects (images, security groups, subnets) by id, name or tags."""

    id: str = ""
    """Cloud object ID to select."""
    name: str = ""
    """Cloud object name to select."""
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    """Tags the cloud object must carry."""


class MetadataOptions(Model):
    http_endpoint: bool = True
    """Enable the VM's instance metadata endpoint. Default true."""
    http_protocol_ipv6: Annotated[bool, DEFAULT_FALSE] = msgspec.field(default=False, name="httpProtocolIPv6")
    """Serve instance metadata over IPv6 too. Default false."""
    http_put_response_hop_limit: int = 1
    """Network hops allowed for metadata responses. Default 1."""
    http_tokens: str = "required"
    """Whether metadata calls need a session token: required or optional. Default required."""


class EBSVolume(Model):
    volume_size: str = ""
    """Disk size, a Kubernetes quantity string such as 200Gi."""
    volume_type: str = ""
    """Cloud disk type (for example gp3)."""
    delete_on_termination: bool = True
    """Delete the disk with the VM. Default true."""
    encrypted: bool = True
    """Encrypt the disk. Default true."""


class BlockDeviceMapping(Model):
    device_name: str = ""
    """Device name in the VM (for example /dev/xvda)."""
    ebs: EBSVolume | None = None
    """The disk attached at that device."""


class GPUNodeClassSpec(Model):
    launch_template: LaunchTemplate | None = None
    """Existing cloud launch template to start from."""
    os_image_type: Literal["Private", "Public", "System"] = "Private"
    """Where the OS image comes from: Private, Public or System. Default Private."""
    os_image_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    """Which OS image to boot; the first term that matches wins."""
    instance_profile: str = ""
    """Cloud instance profile (IAM role) of the VMs."""
    metadata_options: MetadataOptions | None = None
    """Instance metadata endpoint settings."""
    security_group_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    """Security groups of the VMs."""
    subnet_selector_terms: list[SelectorTerm] = msgspec.field(default_factory=list)
    """Subnets the VMs may be placed in."""
    block_device_mappings: list[BlockDeviceMapping] = msgspec.field(default_factory=list)
    """Disks of the VMs."""
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    """Cloud tags put on the VMs."""
    user_data: str = ""
    """Boot script (cloud-init user data) of the VMs."""


class GPUNodeClassStatus(Model):
    """Empty: a node class has no observed state."""


class GPUNodeClass(Model):
    KIND: ClassVar[str] = "GPUNodeClass"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNodeClass"))
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeClassSpec = msgspec.field(default_factory=GPUNodeClassSpec)
    """How VMs are launched; written by an administrator."""
    status: GPUNodeClassStatus = msgspec.field(default_factory=GPUNodeClassStatus)
    """Empty; a node class has no observed state."""


class GPUNodeClaimSpec(Model):
    tflops_offered: Quantity = msgspec.field(name="tflopsOffered")
    """Compute the new VM brings in TFLOPS, a Kubernetes quantity."""
    vram_offered: Quantity = msgspec.field(name="vramOffered")
    """GPU memory the new VM brings in bytes, a Kubernetes quantity."""
    gpu_device_offered: Int32 = msgspec.field(name="gpuDeviceOffered")
    """Number of GPUs the new VM brings."""
    node_name: str = ""
    """Name the Kubernetes node will get."""
    region: str = ""
    """Cloud region to create the VM in."""
    zone: str = ""
    """Availability zone to create the VM in."""
    instance_type: str = ""
    """Cloud instance type (for example p4d.24xlarge)."""
    node_class_ref: GroupKindName | None = None
    """The GPUNodeClass (or Karpenter class) to launch from."""
    capacity_type: str = ""
    """Purchase option, for example OnDemand, Reserved or Spot."""
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)
    """Further vendor-specific launch settings."""


class GPUNodeClaimStatus(Model):
    phase: Annotated[str, REQUIRED] = "Pending"
    """Claim progress, for example Pending, Creating or Bound. Default Pending."""
    instance_id: str = msgspec.field(default="", name="instanceID")
    """Cloud ID of the created VM."""


class GPUNodeClaim(Model):
    KIND: ClassVar[str] = "GPUNodeClaim"
    api_version: str = msgspec.field(default_factory=constant(API_VERSION))
    kind: str = msgspec.field(default_factory=constant("GPUNodeClaim"))
    metadata: Annotated[ObjectMeta, REQUIRED] = msgspec.field(default_factory=ObjectMeta)
    spec: GPUNodeClaimSpec | None = None
    """The VM a pool wants; written by the controller."""
    status: GPUNodeClaimStatus = msgspec.field(default_factory=GPUNodeClaimStatus)
    """Progress of creating the VM; written by the controller."""
