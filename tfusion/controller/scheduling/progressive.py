"""Progressive migration (`NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION=true`): native-GPU pods and
TensorFusion workers kept on separate nodes, as pure functions the three parts share.

Why: a native-GPU pod (a limit of a ProviderConfig's `inUseResourceNames`, e.g. `nvidia.com/gpu`)
gets whole GPUs from the vendor's device plugin, which does not know which GPUs TensorFusion
workers share; on a node where workers run, both could be handed the same GPU. So while a cluster
moves over to TensorFusion one node at a time:

- the pod webhook sends a native-GPU pod that auto-migration does not take to
  `tensor-fusion-scheduler` and changes nothing else (mutate.py `progressive_only`);
- the built-in scheduler binds such a pod with the ordinary node checks plus the native GPU
  resources against the node's allocatable, but only onto a node that runs no TensorFusion worker,
  and takes no GPU from the allocator (scheduler.py); with `--scheduler=extender` the extender's
  filter refuses the same nodes and its bind posts a plain Binding (extender.py), and
  simulate-schedule lists the nodes without workers as `progressiveNodeNames` (simulate.py);
- the node reconciler taints a node `tensor-fusion.ai/used-by=tensor-fusion:PreferNoSchedule`
  while it runs workers and removes the taint when it is idle, so that other schedulers prefer the
  idle nodes too (worker pods tolerate the taint; node.py).

A worker counts on its node from the moment it is bound until it has finished (Succeeded or
Failed); one being deleted still holds its GPUs, so it counts until it is gone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Node, Pod
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.scheduling import nodes as nc

#: pod informer index: the node a live TensorFusion worker is bound to
WORKER_NODE_INDEX = "progressive:worker-node"
#: the node check's name and kube-style reason
CHECK = "ProgressiveMigration"
RUNS_WORKERS = "node(s) run TensorFusion workers"
EVERY_GPU_NODE_BUSY = ("Every node with {resources} runs TensorFusion workers: in progressive migration "
                       "a native GPU pod waits for a node without them.")
TAINT_EFFECT = "PreferNoSchedule"


def worker_node_index(raw: JsonMapping) -> list[str]:
    """[node] for a TensorFusion worker bound there and not finished; [] for any other pod (an
    informer index function: it gets the cached object as it is)."""
    pod = Pod(raw)
    if not pod.node_name or not pod.is_worker or pod.finished:
        return []
    return [pod.node_name]


def used_by_taint() -> dict[str, str]:
    return {"key": tfa.USED_BY, "value": tfa.USED_BY_TENSOR_FUSION, "effect": TAINT_EFFECT}


def _is_used_by_taint(taint: JsonMapping) -> bool:
    return taint.get("key") == tfa.USED_BY and taint.get("effect") == TAINT_EFFECT


def taints_for(node: Node, busy: bool) -> list[JsonMapping] | None:
    """The node's taints with the used-by taint present (busy) or absent (idle); None when they
    already are so. Other taints are kept as they are, in their order."""
    taints = node.taints
    ours = [t for t in taints if _is_used_by_taint(t)]
    if busy and ours == [used_by_taint()]:
        return None
    if not busy and not ours:
        return None
    kept = [t for t in taints if not _is_used_by_taint(t)]
    return [*kept, used_by_taint()] if busy else kept


def every_gpu_node_busy(resources: Sequence[str]) -> str:
    return EVERY_GPU_NODE_BUSY.format(resources=" or ".join(resources))


def worker_failure(node: str, busy: Collection[str]) -> nc.NodeFailure | None:
    """The node check every scheduling path makes for a native-GPU pod (the built-in scheduler, the
    extender's filter and bind, simulate-schedule): a node in `busy` (it runs TensorFusion workers)
    is refused; resolvable, since the workers may finish."""
    return nc.NodeFailure(RUNS_WORKERS, CHECK, False) if node in busy else None


def busy_note(nodes: Mapping[str, Node], resources: Sequence[str], busy: Collection[str]) -> str:
    """The sentence added to "0/N nodes are available: ..." when every node that has the native GPU
    `resources` runs workers (so the pod waits for one to go idle); "" otherwise."""
    gpu_nodes = [n for n, node in nodes.items() if nc.extended_check(dict.fromkeys(resources, 1), node, {}) is None]
    return every_gpu_node_busy(resources) if gpu_nodes and all(n in busy for n in gpu_nodes) else ""
