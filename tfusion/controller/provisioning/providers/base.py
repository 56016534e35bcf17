"""What every cloud provider offers the provisioning code: launch an instance for a GPUNodeClaim,
terminate it, list the instances tfusion launched, and the catalog of instance types it sells.

A provider does I/O and nothing else: it never reads or writes GPUNodeClaims, GPUNodes or pools
(the claim reconciler does), so the same claim flow runs on every provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tfusion.api import annotations as tfa
from tfusion.api.kinds.provisioning import GPUNodeClassSpec
from tfusion.controller.provisioning.catalog import Catalog, InstanceType


class ProviderError(Exception):
    """A provider call that failed. `retryable`: the same call may work later (throttling, capacity,
    a cloud that is down); otherwise the request itself is wrong (bad image, unknown type) and the
    message says which field and value."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class LaunchRequest:
    claim: str  # the GPUNodeClaim's name: idempotency key and the node-provisioner label's value
    node_name: str  # the name the Node will register with
    instance_type: InstanceType
    capacity_type: str  # catalog.ON_DEMAND or catalog.SPOT
    region: str = ""
    zone: str = ""
    node_class: GPUNodeClassSpec | None = None  # the GPUNodeClass's spec (image, subnets, disks, ...)
    node_class_name: str = ""  # its name (Karpenter: the nodeClassRef's name)
    # for the Node; always holds tfa.NODE_PROVISIONER = the claim's name, which is how a joining Node is
    # tied to its claim (the simulated node farm applies them, Karpenter copies a NodeClaim's labels to
    # its Node, the EC2 user data passes them to the kubelet's --node-labels)
    labels: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)  # for the instance (cloud tags)


#: the managed-by label or tag of an instance whose request names no pool
MANAGED_BY_DEFAULT = "tensor-fusion"


def managed_by(request: LaunchRequest) -> str:
    """What an instance's (or NodeClaim's) managed-by label or tag says: the pool the request names in
    its labels or tags, else MANAGED_BY_DEFAULT."""
    return request.labels.get(tfa.MANAGED_BY) or request.tags.get(tfa.MANAGED_BY) or MANAGED_BY_DEFAULT


@dataclass(frozen=True)
class Instance:
    instance_id: str
    claim: str  # the GPUNodeClaim it was launched for ("" when the cloud does not say)
    instance_type: str
    node_name: str
    state: str  # "pending", "running", "terminating" or "terminated"
    capacity_type: str = ""
    zone: str = ""
    launched_at: float = 0.0  # wall-clock seconds


class CloudProvider(Protocol):
    name: str  # "simulated", "karpenter" or "aws"

    def catalog(self) -> Catalog:
        """The instance types this provider can launch, with prices."""
        ...

    async def create(self, request: LaunchRequest) -> Instance:
        """Launch one instance. Idempotent per `request.claim`: when an instance for that claim already
        exists (a retry after a crash), it is returned instead of launching a second one."""
        ...

    async def terminate(self, instance_id: str) -> None:
        """Terminate an instance; an unknown or already terminated one is not an error."""
        ...

    async def list_instances(self) -> list[Instance]:
        """The instances tfusion launched (tagged or labelled as ours) that are not terminated."""
        ...
