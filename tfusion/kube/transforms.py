"""What an informer keeps of each object: the transforms applied before an object enters the cache.

Why: a controller that caches 100,000 pods as decoded JSON pays for every field the API server
sends, most of which no reader here ever looks at, and for one copy of every repeated string
("tensor-fusion.ai/gpupool", "Running", a pool's name, a node's name) per object. controller-runtime
users strip managedFields with a cache transform for the same reason; this module does that, drops
the fields of a kind that the controller does not read (`PRUNED`), interns the keys and short
values so that objects share them, and keeps the subtrees that many objects hold alike (a
Deployment's labels, tolerations and containers) once, in `SHARED` (which paths: `SHARED_PATHS`).

Pruning changes what the cache holds, so two rules keep it safe:
- a pruned field is one that no code reading the cache reads: each entry in `PRUNED` says why, and
  tests/unit/test_kube_transforms.py runs the controller's readers of a pod on a pruned pod and
  compares their answers with the unpruned pod's;
- no write is built by sending back a whole cached object of a pruned kind (a PUT would drop the
  pruned fields on the server): writes of those kinds are merge patches, which name only the
  fields they change.

A transform returns a new object to cache (the server's decoded answer is never edited in place
behind a caller that kept it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import orjson
from msgspec import UNSET

from tfusion.kube import resources as r

Transform = Callable[[dict[str, Any]], dict[str, Any]]

#: strings up to this long are interned: names, label and annotation keys and values, quantities,
#: phases. Longer ones (JSON in annotations, certificates) are rarely shared and not worth the lookup.
INTERN_MAX_LEN = 96

#: container fields no reader of a cached pod uses: probes, how the kubelet runs and logs the
#: container, and its mounts (the webhook and the worker reconciler build them into pods they
#: write; none reads them back from the cache). Resources, env (connection_of reads a client's
#: connection name from it), ports and names stay.
_CONTAINER_PRUNED = ("volumeMounts", "volumeDevices", "terminationMessagePath", "terminationMessagePolicy",
                     "imagePullPolicy", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle",
                     "command", "args", "workingDir", "securityContext", "stdin", "stdinOnce", "tty")

#: container status fields nobody here reads (the runtime's ids and the image it pulled)
_CONTAINER_STATUS_PRUNED = ("image", "imageID", "containerID", "lastState")

#: by kind, the paths dropped; `[]` steps into every item of a list
PRUNED: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Pod": (
        # volumes are the kubelet's; the scheduler reads none (it has no volume plugins).
        # terminationGracePeriodSeconds stays: preemption waits that long for its victims
        ("spec", "volumes"),
        ("spec", "dnsPolicy"), ("spec", "dnsConfig"), ("spec", "enableServiceLinks"), ("spec", "securityContext"),
        ("spec", "serviceAccountName"), ("spec", "serviceAccount"),
        ("spec", "automountServiceAccountToken"), ("spec", "imagePullSecrets"), ("spec", "readinessGates"),
        *(("spec", part, "[]", field) for part in ("containers", "initContainers", "ephemeralContainers")
          for field in _CONTAINER_PRUNED),
        *(("status", part, "[]", field) for part in ("containerStatuses", "initContainerStatuses")
          for field in _CONTAINER_STATUS_PRUNED),
    ),
    # a node's image list and attached volumes are large and only the kubelet's and the
    # scheduler's volume/image plugins read them; ours read allocatable, capacity, conditions,
    # taints, unschedulable, labels and addresses
    "Node": (("status", "images"), ("status", "volumesInUse"), ("status", "volumesAttached"),
             ("status", "daemonEndpoints"), ("status", "config")),
    # A TensorFusionWorkload (one per Deployment, cached with its pods) has nothing unread to drop:
    # its whole spec is hashed into the worker template (reconcilers/workers.py template_hash), its
    # status is compared field by field before each status write (reconcilers/common.py
    # write_status: a dropped field would be written again on every pass), and the webhook compares
    # its labels, annotations and owners with the ones it wants. It is shared instead (SHARED_PATHS).
    # Deployments, ReplicaSets, StatefulSets and Jobs are not cached by the controller at all: the
    # webhook GETs a pod's owner once and keeps only what it learnt (webhook/workloads.py OwnerResolver).
}


def strip_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Who owns which field is the API server's business; it roughly doubles an object. A write
    built from a cached object sends no managedFields, which the API server reads as "keep them"."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


#: by kind, the subtrees that many objects hold alike and that the cache keeps once for all of them
#: (see `SharedTable`): a Deployment's pods carry one set of labels, owner references, tolerations,
#: affinity and containers; a pool's nodes one allocatable; a GPU model one capacity
SHARED_PATHS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Pod": (
        ("metadata", "labels"), ("metadata", "ownerReferences"), ("metadata", "finalizers"),
        ("spec", "containers", "[]"), ("spec", "initContainers", "[]"), ("spec", "tolerations"),
        ("spec", "affinity"), ("spec", "nodeSelector"), ("spec", "overhead"),
        ("status", "conditions"), ("status", "containerStatuses"), ("status", "initContainerStatuses"),
    ),
    "Node": (("spec", "taints"), ("status", "allocatable"), ("status", "capacity")),
    "GPU": (("metadata", "labels"), ("status", "capacity"), ("status", "available"), ("status", "nodeSelector")),
    # the webhook makes the workloads of one profile and pool alike: one spec (no names in it), one
    # set of labels, annotations and finalizers; their resources are shared when the rest differs
    "TensorFusionWorkload": (
        ("metadata", "labels"), ("metadata", "annotations"), ("metadata", "finalizers"),
        ("spec",), ("spec", "resources"), ("spec", "autoScalingConfig"),
    ),
}


class SharedTable:
    """Equal subtrees kept once: `canonical(value)` is the first value equal to it that was seen.

    A subtree is known by its JSON text (equal JSON, equal value: 1, 1.0 and True stay apart), so
    a hit costs one encoding and no deep comparison. What it hands out is shared by every cached
    object that holds it; like everything in an informer's cache it is never modified (the tests
    check `changed()` after running the controller's readers). The table holds at most
    `max_entries` subtrees and starts afresh when full: objects already cached keep what they
    share, and the subtrees of objects deleted long ago are not kept for ever.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        #: by JSON text as a str: orjson's bytes keep the capacity of its write buffer (several kB
        #: for a short text), a decoded str is exactly its length
        self._by_text: dict[str, Any] = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self._by_text)

    def canonical(self, value: Any) -> Any:
        key = self.key_of(value)
        if key is None:
            return value
        found = self.lookup(key)
        return self.keep(key, value) if found is None else found

    @staticmethod
    def key_of(value: Any) -> str | None:
        """What the table knows `value` by; None for a value that is not JSON (an integer past
        64 bits), which is kept apart."""
        try:
            return orjson.dumps(value).decode()
        except (TypeError, orjson.JSONEncodeError):
            return None

    def lookup(self, key: str) -> Any:
        """The value kept under `key`, or None (the caller then `keep`s its own)."""
        found = self._by_text.get(key)
        if found is not None:
            self.hits += 1
        return found

    def keep(self, key: str, value: Any) -> Any:
        if len(self._by_text) >= self.max_entries:
            self._by_text.clear()
        self._by_text[key] = value
        return value

    def changed(self) -> list[Any]:
        """The shared subtrees that no longer match the text they were stored under (something
        modified a cached object in place): empty unless there is a bug."""
        return [value for key, value in self._by_text.items() if orjson.loads(key) != value]

    def clear(self) -> None:
        self._by_text.clear()


#: the one table of the process: pods, nodes and GPUs share strings and subtrees across informers
SHARED = SharedTable()

#: markers in a compiled rule tree: a key whose value is dropped; the key under which a node says
#: that the subtree there is shared
DROP = None
_SHARE = "\x00share"
#: a compiled set of rules: key -> DROP, or the rules below that key ("[]" for a list's items)
_Tree = dict[str, Any]


def _compile(drop: tuple[tuple[str, ...], ...], share: tuple[tuple[str, ...], ...]) -> _Tree:
    tree: _Tree = {}
    for path in share:
        node = tree
        for step in path:
            node = node.setdefault(step, {})
        node[_SHARE] = True
    for path in drop:
        node = tree
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = DROP
    return tree


_intern = sys.intern


def _value(value: Any) -> Any:
    """A copy of `value` with its short strings and its keys interned."""
    kind = type(value)
    if kind is str:
        return _intern(value) if len(value) <= INTERN_MAX_LEN else value
    if kind is dict:
        return {(_intern(k) if len(k) <= INTERN_MAX_LEN else k): _value(v) for k, v in value.items()}
    if kind is list:
        return [_value(v) for v in value]
    return value


def _stripped(node: Any, tree: _Tree) -> Any:
    """`node` without the paths `tree` drops: copied only along them, nothing interned."""
    kind = type(node)
    if kind is dict:
        if not any(k in tree for k in node):
            return node
        out = {}
        for k, v in node.items():
            if k not in tree:
                out[k] = v
            elif tree[k] is not DROP:
                out[k] = _stripped(v, tree[k])
        return out
    if kind is list:
        items = tree.get("[]")
        return node if items is None else [_stripped(v, items) for v in node]
    return node


class Pruner:
    """A cache transform: one walk that copies an object, dropping the paths in `drop`, interning
    short strings and keys, and replacing each subtree at a path in `share` by the equal one the
    table already holds (`[]` in a path steps into every item of a list)."""

    def __init__(self, drop: tuple[tuple[str, ...], ...], share: tuple[tuple[str, ...], ...] = (),
                 table: SharedTable = SHARED) -> None:
        self.table = table
        self._tree = _compile(drop, share)

    def drops(self, path: tuple[str, ...]) -> bool:
        """Whether the copy leaves out the field at `path`."""
        node: Any = self._tree
        for step in path[:-1]:
            node = node.get(step) if isinstance(node, dict) else None
        return isinstance(node, dict) and path[-1] in node and node[path[-1]] is DROP

    def __call__(self, obj: dict[str, Any]) -> dict[str, Any]:
        result = self._copy(obj, self._tree)
        assert isinstance(result, dict)
        return result

    def _copy(self, node: Any, tree: _Tree) -> Any:
        if _SHARE in tree:
            return self._shared(node, tree)
        return self._walk(node, tree)

    def _shared(self, node: Any, tree: _Tree) -> Any:
        """The table's subtree equal to `node` pruned by `tree`. Looked up by the pruned subtree's
        JSON before any copy: most of a pod is alike across its Deployment, and a hit costs one
        encoding where the copy walks and interns every string of it."""
        key = self.table.key_of(_stripped(node, tree))
        if key is None:
            return self._walk(node, tree)
        found = self.table.lookup(key)
        if found is not None:
            return found
        return self.table.keep(key, self._walk(node, tree))

    def _walk(self, node: Any, tree: _Tree) -> Any:
        kind = type(node)
        out: Any
        if kind is dict:
            out = {}
            for k, v in node.items():
                if k in tree:
                    below = tree[k]
                    if below is not DROP:
                        out[_intern(k)] = self._copy(v, below)
                else:
                    out[_intern(k) if len(k) <= INTERN_MAX_LEN else k] = _value(v)
        elif kind is list:
            items = tree.get("[]")
            out = [self._copy(v, items) for v in node] if items is not None else [_value(v) for v in node]
        else:
            return _value(node)
        return out


def prune(paths: tuple[tuple[str, ...], ...]) -> Transform:
    """Drop `paths` and intern what is left (see `Pruner`)."""
    return Pruner(paths)


def intern_strings(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` whose short string values and keys are interned: every cached object then
    shares one "pool-0", one "node-0042", one "Running", one "100m"."""
    result = _value(obj)
    assert isinstance(result, dict)
    return result


def transform_for(resource: r.ApiResource, *, pruning: bool = True) -> Transform:
    """The cache transform of `resource`: managedFields stripped, the kind's unread fields dropped
    and its common subtrees shared (with `pruning`), short values interned; one copy of the object."""
    if not pruning:
        return DEFAULT_TRANSFORM
    return Pruner((("metadata", "managedFields"), *PRUNED.get(resource.kind, ())),
                  SHARED_PATHS.get(resource.kind, ()))


#: what an informer keeps when nobody asked for pruning: managedFields never, repeated strings once
DEFAULT_TRANSFORM: Transform = Pruner((("metadata", "managedFields"),))


# --- left out while decoding ------------------------------------------------------------------
#
# managedFields is about three quarters of the JSON objects in a pod as the API server sends it.
# Decoded generically, every one of them is built, then dropped by the transform and freed again: a
# page of 500 pods took 86 ms to decode whole and 19 ms through `page_decoder`, which parses
# managedFields without building anything (msgspec skips a field its schema does not declare).


class _Meta(msgspec.Struct):
    """Every field of ObjectMeta but managedFields (a field kube adds later would be left out too)."""

    name: Any = UNSET
    generateName: Any = UNSET
    namespace: Any = UNSET
    selfLink: Any = UNSET
    uid: Any = UNSET
    resourceVersion: Any = UNSET
    generation: Any = UNSET
    creationTimestamp: Any = UNSET
    deletionTimestamp: Any = UNSET
    deletionGracePeriodSeconds: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET
    ownerReferences: Any = UNSET
    finalizers: Any = UNSET


class _Object(msgspec.Struct):
    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: _Meta | None = None
    spec: Any = UNSET
    status: Any = UNSET


class _Page(msgspec.Struct):
    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: Any = UNSET
    items: list[_Object] | None = None


_META_FIELDS = _Meta.__struct_fields__
_OBJECT_FIELDS = ("apiVersion", "kind", "spec", "status")
_PAGE_FIELDS = ("apiVersion", "kind", "metadata")
_PAGES = msgspec.json.Decoder(_Page)

#: the kinds whose objects have no top-level fields but apiVersion, kind, metadata, spec and
#: status, so that the schema above loses nothing else of them (a ConfigMap's data, an Event's
#: fields would be lost: such kinds are decoded whole)
SPEC_STATUS_KINDS = frozenset({("", "Pod"), ("", "Node"), ("", "Namespace")})


def _object_dict(obj: _Object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    meta = obj.metadata
    if meta is not None:
        out["metadata"] = {f: v for f in _META_FIELDS if (v := getattr(meta, f)) is not UNSET}
    for f in _OBJECT_FIELDS:
        v = getattr(obj, f)
        if v is not UNSET:
            out[f] = v
    return out


def _page_without_managed_fields(content: bytes) -> dict[str, Any]:
    """A list's JSON as a dict, its items without metadata.managedFields. Raises ValueError
    (msgspec's errors are ValueErrors) for a body that is not such a list."""
    page = _PAGES.decode(content)
    out: dict[str, Any] = {f: v for f in _PAGE_FIELDS if (v := getattr(page, f)) is not UNSET}
    out["items"] = [_object_dict(obj) for obj in page.items or ()]
    return out


def page_decoder(resource: r.ApiResource, transform: Transform) -> Callable[[bytes], Any] | None:
    """How an informer with `transform` decodes a page of `resource`'s list: without managedFields
    when the transform drops them anyway and the kind is one of `SPEC_STATUS_KINDS` or
    tensor-fusion's own; None to decode it whole."""
    kind_known = resource.group == r.TF_GROUP or (resource.group, resource.kind) in SPEC_STATUS_KINDS
    if kind_known and isinstance(transform, Pruner) and transform.drops(("metadata", "managedFields")):
        return _page_without_managed_fields
    return None
