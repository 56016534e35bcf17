"""Placing the pods that name `default-scheduler` (or no scheduler), when tfusion runs the embedded
API server.

Why: on one box (`tfusion --role=all`, or any role with `--kube=embedded`) no kube-scheduler runs,
so without this a plain pod (`kubectl run`, a Deployment's pods, a remote vGPU client pod) would stay
Pending forever. The built-in scheduler takes them through its own queue, conditions, events and
`/api/why`, with the node checks only (nodes.py: Ready, cordon, taints, nodeSelector, required node
affinity, CPU, memory, pod count) plus the other resources the pod requests (e.g.
`ephemeral-storage`, `nvidia.com/gpu`) against the node's allocatable, as kube-scheduler's
NodeResourcesFit does. No GPU stage runs: no allocator call and no gpu-ids annotation, even when the
pod carries TensorFusion annotations (such a pod that wants GPUs from tfusion names
tensor-fusion-scheduler; the pod webhook sets it).

On a real cluster kube-scheduler owns these pods: `Settings.schedule_default_pods` is off there and
only the embedded wiring (roles.py) turns it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from tfusion.api.accessors import Node, Pod, section
from tfusion.controller.scheduling import nodes as nc

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Decision, Scheduler

DEFAULT_SCHEDULER = "default-scheduler"
#: resources the node checks already count (nodes.resource_check)
COUNTED = frozenset({"cpu", "memory"})


def is_default(pod: Pod) -> bool:
    """The pod is kube-scheduler's: it names default-scheduler, or no scheduler at all."""
    return pod.scheduler_name in ("", DEFAULT_SCHEDULER)


def _resource_names(pod: Pod) -> Iterator[str]:
    for container in (*pod.containers, *pod.init_containers):
        for group in ("requests", "limits"):
            yield from (str(name) for name in section(container, "resources", group))


def other_resources(pod: Pod) -> dict[str, int]:
    """What the pod asks of resources other than CPU and memory (name -> amount)."""
    names = sorted(set(_resource_names(pod)) - COUNTED)
    return nc.extended_requests(pod, names) if names else {}


def place(scheduler: Scheduler, pod: Pod, demand: nc.PodDemand) -> Decision:
    """The node checks and the pod's other resources on every node; the emptiest node that passes."""
    wanted = other_resources(pod)
    names = sorted(wanted)

    def check(name: str, node: Node) -> nc.NodeFailure | None:
        failure = scheduler.node_failure(demand, node)
        if failure is None and wanted:
            failure = nc.extended_check(wanted, node, scheduler.native_used(name, names))
        return failure

    decision = scheduler.place_by_nodes(pod, demand, scheduler.nodes_by_name(), check)
    decision.native = wanted
    return decision
