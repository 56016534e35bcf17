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

A pod naming any other scheduler has nobody to place it there (kube leaves it Pending in silence):
it gets PodScheduled=False and a FailedScheduling event saying that its scheduler does not run here.

On a real cluster kube-scheduler owns these pods, and other schedulers run:
`Settings.schedule_default_pods` is off there and only the embedded wiring (roles.py) turns it on.
(A scheduler of the user's own against the embedded API server still binds its pods; the condition
written here is then replaced by the binding's PodScheduled=True.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from tfusion.allocator.framework import Code
from tfusion.api.accessors import Node, Pod, section
from tfusion.api.annotations import SCHEDULER_NAME
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import why_text

if TYPE_CHECKING:
    from tfusion.controller.scheduling.scheduler import Decision, Scheduler

DEFAULT_SCHEDULER = "default-scheduler"
#: resources the node checks already count (nodes.resource_check)
COUNTED = frozenset({"cpu", "memory"})


def is_default(pod: Pod) -> bool:
    """The pod is kube-scheduler's: it names default-scheduler, or no scheduler at all."""
    return pod.scheduler_name in ("", DEFAULT_SCHEDULER)


def no_scheduler_message(name: str) -> str:
    return (f"no scheduler named {name!r} runs here: this API server's pods are placed by "
            f"{SCHEDULER_NAME} and {DEFAULT_SCHEDULER} (set spec.schedulerName to one of them, or leave it out).")


def _resource_names(pod: Pod) -> Iterator[str]:
    for container in (*pod.containers, *pod.init_containers):
        for group in ("requests", "limits"):
            yield from (str(name) for name in section(container, "resources", group))


def other_resources(pod: Pod) -> dict[str, int]:
    """What the pod asks of resources other than CPU and memory (name -> amount)."""
    names = sorted(set(_resource_names(pod)) - COUNTED)
    return nc.extended_requests(pod, names) if names else {}


def place(scheduler: Scheduler, pod: Pod, demand: nc.PodDemand) -> Decision:
    """The node checks and the pod's other resources on every node; the emptiest node that passes.
    A pod of another scheduler: why it waits."""
    if not is_default(pod):
        from tfusion.controller.scheduling.scheduler import Decision

        return Decision(demand=demand, why=why_text(pod, no_scheduler_message(pod.scheduler_name), Code.UNRESOLVABLE))
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
