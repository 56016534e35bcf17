"""Where the controller reaches each node's hypervisor: the Node's InternalIP and --port.

Why one place: the drift audit (`reconcilers/drift.py`, `GET /api/v1/workers`), the autoscaler's
hypervisor usage source (`autoscaler/sources.py`, `GET /api/v1/usage`) and the controller's
`GET /api/usage` (usage_http.py) all call every Running GPUNode's hypervisor, and must agree on which
nodes count and how the address is written (an IPv6 address in brackets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfusion.api.accessors import Body, Node, sequence_of_maps
from tfusion.controller.reconcilers.common import RUNNING
from tfusion.kube import resources as r

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

#: how long the controller waits for one hypervisor's answer
HYPERVISOR_TIMEOUT_S = 2.0


def node_address(node: Node | None) -> str | None:
    """The Node's first InternalIP, or None."""
    for address in sequence_of_maps(node.status.get("addresses") if node is not None else None):
        if address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    return None


def hypervisor_url(address: str, port: int) -> str:
    """`http://host:port` for an IPv4 or IPv6 address."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def running_hypervisors(runtime: ControllerRuntime) -> dict[str, tuple[Body, str]]:
    """GPUNode name -> (the GPUNode, its hypervisor's base URL), for each Running GPUNode whose Node
    has an InternalIP."""
    nodes = runtime.informer(r.NODES)
    port = runtime.settings.hypervisor_port
    found: dict[str, tuple[Body, str]] = {}
    for gpunode in map(Body, runtime.informer(r.GPUNODES).list()):
        if gpunode.phase != RUNNING:
            continue
        node = nodes.get(gpunode.name)
        address = node_address(Node(node) if node is not None else None)
        if address is not None:
            found[gpunode.name] = (gpunode, hypervisor_url(address, port))
    return found


def hypervisor_urls(runtime: ControllerRuntime) -> dict[str, str]:
    """GPUNode name -> its hypervisor's base URL, for each of `running_hypervisors`."""
    return {name: base for name, (_, base) in running_hypervisors(runtime).items()}
