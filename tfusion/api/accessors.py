"""Typed read-only views of the Kubernetes objects tfusion reads: `Meta`, `Body` and one per kind.

Why it exists: the informer cache holds objects as the API server sent them (decoded JSON), and
every consumer used to dig into them with its own `.get("metadata") or {}` chain and its own
`_meta()`, each with its own idea of what a missing or mistyped field means. A view wraps the raw
mapping (no copy, two slots, nothing cached), so a field is read the same way everywhere and a
wrong-typed value (a list where a map belongs) reads as absent instead of raising in a reconciler.

Views cost nothing to keep: they are made where an object is read and dropped after, so the cache
stays the API server's bytes decoded once (the scale issue's memory budget per pod counts those).
Writes do not go through views: a writer builds its patch as a plain dict.

`section(obj, "spec", "template", "spec")` is the one nested getter for the places a view has no
property for (pod templates inside workloads, free-form config blocks).

Types: a view wraps decoded JSON (`JsonMapping`); the getters take any `Mapping[str, object]`
(TypedDict wire records too) since they check every value they read. `spec`, `status`,
`section()` and `containers` still return `Mapping[str, Any]`: they are the way into fields no
view has yet, and their callers narrow what they read; typing them as JSON would make every such
caller cast (`Gpu.available` and the container lists too, for now). The smaller maps (conditions,
taints, owner references, capacities, pool config blocks) are `JsonMapping`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.jsontypes import JsonMapping

EMPTY: Mapping[str, Any] = {}


def section(obj: Mapping[str, object] | None, *path: str) -> Mapping[str, Any]:
    """The mapping at `path` inside `obj`, or an empty one when any step is missing or not a map."""
    # decoded JSON is plain dicts, and a missing field None: both are settled before the ABC check,
    # which costs ~10x more (and as much for None as for a mapping)
    node = _walk(obj, path)
    if type(node) is dict:
        return node
    return EMPTY if node is None or not isinstance(node, Mapping) else node


def _walk(obj: Mapping[str, object] | None, path: tuple[str, ...]) -> object:
    """The value at `path` inside `obj` (None when a step is missing or not a map); one loop, no
    slicing: views call this on every field read."""
    node: object = obj
    for key in path:
        if type(node) is not dict and (node is None or not isinstance(node, Mapping)):
            return None
        node = node.get(key)
    return node


def items(obj: Mapping[str, object] | None, *path: str) -> list[Any]:
    """The list at `path` inside `obj`, or an empty list when any step is missing or not a list."""
    value = _walk(obj, path) if path else None
    return list(value) if isinstance(value, list) else []


def text(obj: Mapping[str, object] | None, *path: str) -> str:
    """The string at `path` inside `obj`, or "" when missing or not a string."""
    value = _walk(obj, path) if path else None
    return value if isinstance(value, str) else ""


def _mappings(values: list[Any]) -> list[Mapping[str, Any]]:
    """The entries of a list that are maps (plain dicts settled before the costlier ABC check)."""
    return [v for v in values if type(v) is dict or isinstance(v, Mapping)]


def _str_map(value: object) -> Mapping[str, str]:
    if type(value) is not dict and (value is None or not isinstance(value, Mapping)):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, str)}


def _str_at(obj: JsonMapping, key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


class Meta:
    """`metadata` of any object. Its fields are read directly: `raw` is always a mapping, and the
    informers' handlers and indexes read them 10 times per cached pod."""

    __slots__ = ("raw",)

    def __init__(self, raw: JsonMapping) -> None:
        self.raw = raw

    @property
    def name(self) -> str:
        return _str_at(self.raw, "name")

    @property
    def namespace(self) -> str:
        return _str_at(self.raw, "namespace")

    @property
    def uid(self) -> str:
        return _str_at(self.raw, "uid")

    @property
    def resource_version(self) -> str:
        return _str_at(self.raw, "resourceVersion")

    @property
    def generation(self) -> int:
        value = self.raw.get("generation")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def labels(self) -> Mapping[str, str]:
        """Labels with string values (what the API server allows); never None."""
        return _str_map(self.raw.get("labels"))

    @property
    def annotations(self) -> Mapping[str, str]:
        """Annotations with string values; never None."""
        return _str_map(self.raw.get("annotations"))

    def label(self, key: str) -> str | None:
        labels = self.raw.get("labels")
        value = (labels if type(labels) is dict else section(self.raw, "labels")).get(key)
        return value if isinstance(value, str) else None

    def annotation(self, key: str) -> str | None:
        annotations = self.raw.get("annotations")
        value = (annotations if type(annotations) is dict else section(self.raw, "annotations")).get(key)
        return value if isinstance(value, str) else None

    @property
    def finalizers(self) -> list[str]:
        return [f for f in items(self.raw, "finalizers") if isinstance(f, str)]

    @property
    def owner_references(self) -> Sequence[JsonMapping]:
        return [ref for ref in items(self.raw, "ownerReferences") if isinstance(ref, Mapping)]

    def controller_ref(self) -> JsonMapping | None:
        """The owner reference with `controller: true`, if any."""
        return next((ref for ref in self.owner_references if ref.get("controller") is True), None)

    @property
    def creation_timestamp(self) -> str:
        return text(self.raw, "creationTimestamp")

    @property
    def deletion_timestamp(self) -> str | None:
        return text(self.raw, "deletionTimestamp") or None

    @property
    def deleting(self) -> bool:
        """True once a delete was accepted (the object waits on its finalizers)."""
        return bool(self.raw.get("deletionTimestamp"))


class Body:
    """Any object: its metadata, spec and status as mappings that are never None."""

    __slots__ = ("raw",)

    def __init__(self, raw: JsonMapping) -> None:
        self.raw = raw

    @property
    def api_version(self) -> str:
        return text(self.raw, "apiVersion")

    @property
    def kind(self) -> str:
        return text(self.raw, "kind")

    @property
    def meta(self) -> Meta:
        meta = self.raw.get("metadata")
        return Meta(meta if type(meta) is dict else section(self.raw, "metadata"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return section(self.raw, "spec")

    @property
    def status(self) -> Mapping[str, Any]:
        return section(self.raw, "status")

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name): the workqueue key of a namespaced object; namespace "" when cluster-scoped."""
        return self.meta.namespace, self.meta.name

    @property
    def conditions(self) -> Sequence[JsonMapping]:
        return _mappings(items(self.raw, "status", "conditions"))

    def condition(self, type_: str) -> JsonMapping | None:
        return next((c for c in self.conditions if c.get("type") == type_), None)

    @property
    def phase(self) -> str:
        return text(self.raw, "status", "phase")


class Pod(Body):
    """core/v1 Pod."""

    __slots__ = ()

    @property
    def node_name(self) -> str:
        return text(self.raw, "spec", "nodeName")

    @property
    def scheduler_name(self) -> str:
        return text(self.raw, "spec", "schedulerName")

    @property
    def containers(self) -> list[Mapping[str, Any]]:
        return _mappings(items(self.raw, "spec", "containers"))

    @property
    def init_containers(self) -> list[Mapping[str, Any]]:
        return _mappings(items(self.raw, "spec", "initContainers"))

    @property
    def container_statuses(self) -> list[Mapping[str, Any]]:
        return _mappings(items(self.raw, "status", "containerStatuses"))

    @property
    def node_selector(self) -> Mapping[str, str]:
        return _str_map(self.spec.get("nodeSelector"))

    @property
    def scheduling_gates(self) -> list[str]:
        gates = items(self.raw, "spec", "schedulingGates")
        return [g["name"] for g in gates if isinstance(g, Mapping) and isinstance(g.get("name"), str)]

    @property
    def restart_policy(self) -> str:
        return text(self.raw, "spec", "restartPolicy") or "Always"

    @property
    def host_network(self) -> bool:
        return self.spec.get("hostNetwork") is True

    @property
    def pod_ip(self) -> str:
        return text(self.raw, "status", "podIP")

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: its containers will not run again and what it held can be released."""
        return self.phase in tfa.FINISHED_POD_PHASES

    @property
    def component(self) -> str:
        """Its `tensor-fusion.ai/component` label (worker, client, hypervisor, ...); "" when none."""
        return self.meta.label(tfa.COMPONENT) or ""

    @property
    def is_worker(self) -> bool:
        """A pod that holds GPUs: a vGPU worker, or a local-GPU pod the webhook made one."""
        return self.component == tfa.COMPONENT_WORKER

    @property
    def is_client(self) -> bool:
        """A remote vGPU client: it holds no GPU, its workers do."""
        return self.component == tfa.COMPONENT_CLIENT

    @property
    def holds_gpus(self) -> bool:
        """A worker whose GPUs are still held: bound, with gpu-ids, not finished, and not being
        deleted after the controller's finalizer went (the original's recovery rule, plus "not
        finished"). The allocator's recovery, adoption and drift audit, and the billing, read this."""
        if not self.is_worker or not self.node_name or not self.meta.annotation(tfa.GPU_IDS) or self.finished:
            return False
        return not (self.meta.deleting and tfa.FINALIZER not in self.meta.finalizers)


class Node(Body):
    """core/v1 Node."""

    __slots__ = ()

    @property
    def allocatable(self) -> JsonMapping:
        return section(self.raw, "status", "allocatable")

    @property
    def capacity(self) -> JsonMapping:
        return section(self.raw, "status", "capacity")

    @property
    def taints(self) -> Sequence[JsonMapping]:
        return [t for t in items(self.raw, "spec", "taints") if isinstance(t, Mapping)]

    @property
    def unschedulable(self) -> bool:
        return self.spec.get("unschedulable") is True

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return cond is not None and cond.get("status") == "True"


class Gpu(Body):
    """tensor-fusion.ai/v1 GPU (cluster-scoped; everything interesting is in status)."""

    __slots__ = ()

    @property
    def uuid(self) -> str:
        return text(self.raw, "status", "uuid")

    @property
    def node_selector(self) -> Mapping[str, str]:
        return _str_map(self.status.get("nodeSelector"))

    @property
    def gpu_model(self) -> str:
        return text(self.raw, "status", "gpuModel")

    @property
    def used_by(self) -> str:
        return text(self.raw, "status", "usedBy")

    @property
    def capacity(self) -> JsonMapping:
        return section(self.raw, "status", "capacity")

    @property
    def available(self) -> Mapping[str, Any]:
        return section(self.raw, "status", "available")


class GpuNode(Body):
    """tensor-fusion.ai/v1 GPUNode."""

    __slots__ = ()

    @property
    def manage_mode(self) -> str:
        return text(self.raw, "spec", "manageMode")


class GpuNodeClaim(Body):
    """tensor-fusion.ai/v1 GPUNodeClaim: one node a pool (or the expander) asked a provider for."""

    __slots__ = ()

    @property
    def pool(self) -> str:
        return self.meta.label(tfa.MANAGED_BY) or ""

    @property
    def instance_id(self) -> str:
        return text(self.raw, "status", "instanceID")

    @property
    def instance_type(self) -> str:
        return text(self.raw, "spec", "instanceType")

    @property
    def capacity_type(self) -> str:
        return text(self.raw, "spec", "capacityType")

    @property
    def node_name(self) -> str:
        """The Node's name: spec.nodeName, else the claim's own name."""
        return text(self.raw, "spec", "nodeName") or self.name

    @property
    def gpu_count(self) -> int:
        value = self.spec.get("gpuDeviceOffered")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


class GpuPool(Body):
    """tensor-fusion.ai/v1 GPUPool."""

    __slots__ = ()

    @property
    def capacity_config(self) -> JsonMapping:
        return section(self.raw, "spec", "capacityConfig")

    @property
    def provisioning_mode(self) -> str:
        """AutoSelect (the default), Provisioned or Karpenter."""
        return text(self.raw, "spec", "nodeManagerConfig", "provisioningMode") or "AutoSelect"

    @property
    def node_manager_config(self) -> JsonMapping:
        return section(self.raw, "spec", "nodeManagerConfig")

    @property
    def qos_config(self) -> JsonMapping:
        return section(self.raw, "spec", "qosConfig")

    @property
    def component_config(self) -> JsonMapping:
        return section(self.raw, "spec", "componentConfig")


class Workload(Body):
    """tensor-fusion.ai/v1 TensorFusionWorkload (and WorkloadProfile, which shares its spec)."""

    __slots__ = ()

    @property
    def pool_name(self) -> str:
        return text(self.raw, "spec", "poolName")

    @property
    def replicas(self) -> int | None:
        value = self.spec.get("replicas")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def resources(self) -> JsonMapping:
        return section(self.raw, "spec", "resources")

    @property
    def qos(self) -> str:
        return text(self.raw, "spec", "qos")

    @property
    def is_local_gpu(self) -> bool:
        return self.spec.get("isLocalGPU") is True


def sequence_of_maps(value: object) -> Sequence[JsonMapping]:
    """The maps of a JSON list (anything else reads as empty)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
