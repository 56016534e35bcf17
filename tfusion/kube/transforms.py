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

import hashlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import orjson
from msgspec import UNSET

from tfusion.api.accessors import section
from tfusion.api.crds import openapi_schema_view
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
        #: by JSON text as a str (orjson's bytes keep the capacity of its write buffer, several kB
        #: for a short text; a decoded str is exactly its length), or, for subtrees of a list page
        #: (`PrunedDecoder`), by bytes: the path's tag, then the JSON text as the API server sent it
        #: before pruning
        self._by_text: dict[str | bytes, Any] = {}
        #: by tag, the Pruner and the rules that made the values kept under it
        self.rules: dict[bytes, tuple[Pruner, _Tree]] = {}
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

    def lookup(self, key: str | bytes) -> Any:
        """The value kept under `key`, or None (the caller then `keep`s its own)."""
        found = self._by_text.get(key)
        if found is not None:
            self.hits += 1
        return found

    def keep(self, key: str | bytes, value: Any) -> Any:
        if len(self._by_text) >= self.max_entries:
            self._by_text.clear()
        self._by_text[key] = value
        return value

    def changed(self) -> list[Any]:
        """The shared subtrees that no longer match the text they were stored under (something
        modified a cached object in place): empty unless there is a bug."""
        return [value for key, value in self._by_text.items() if self._value_of(key) != value]

    def _value_of(self, key: str | bytes) -> Any:
        if isinstance(key, str):
            return orjson.loads(key)
        tag, _, text = key.partition(b"\x00")
        pruner, tree = self.rules[tag + b"\x00"]
        return pruner._walk(orjson.loads(text), tree)

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
        self.tree = _compile(drop, share)
        self._decoders: dict[str, PrunedDecoder] = {}

    def drops(self, path: tuple[str, ...]) -> bool:
        """Whether the copy leaves out the field at `path`."""
        node: Any = self.tree
        for step in path[:-1]:
            node = node.get(step) if isinstance(node, dict) else None
        return isinstance(node, dict) and path[-1] in node and node[path[-1]] is DROP

    def __call__(self, obj: dict[str, Any]) -> dict[str, Any]:
        result = self._copy(obj, self.tree)
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

    def shared_raw(self, tag: bytes, raw: msgspec.Raw, tree: _Tree) -> Any:
        """The table's subtree for the JSON text `raw` found at the path `tag` names; decoded and
        pruned by `tree` only when the table has none yet (a list's items come this way, see
        `PrunedDecoder`)."""
        key = tag + raw
        found = self.table.lookup(key)
        if found is not None:
            return found
        return self.table.keep(key, self._walk(orjson.loads(memoryview(raw)), tree))

    def decoder(self, kind: str, levels: Callable[[], Mapping[tuple[str, ...], tuple[str, ...]]]) -> PrunedDecoder:
        """The decoder of `kind`'s pages and events into objects pruned by this (made once, on
        `levels()`)."""
        decoder = self._decoders.get(kind)
        if decoder is None:
            decoder = self._decoders[kind] = PrunedDecoder(self, kind, levels())
        return decoder

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


# --- decoded and pruned in one pass ----------------------------------------------------------
#
# Decoding a list page whole builds every JSON object of every item, most of which the Pruner then
# drops (managedFields is about three quarters of a pod's objects) or replaces by the one its table
# already holds (a Deployment's containers, tolerations, labels); both are then freed again.
# `PrunedDecoder` instead parses each item into typed records whose fields are the kind's known
# ones (`LEVELS`): a dropped field is skipped unbuilt, a shared subtree is taken as its raw JSON text
# and looked up in the table by that text, so that only the first pod of a Deployment builds it.
# A page of 500 of benchmarks/scale.py's pods, decoded and pruned: 45 ms whole, 31 ms with
# managedFields skipped, 14-17 ms this way.
#
# Nothing is lost by it: a record refuses a field it does not know (a field a newer Kubernetes
# added), and a page with such an item is decoded whole and pruned as before.

_OBJECT = ("apiVersion", "kind", "metadata", "spec", "status")
_OBJECT_META = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
                "ownerReferences", "finalizers", "managedFields")
_POD_SPEC = ("volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
             "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector",
             "serviceAccountName", "serviceAccount", "automountServiceAccountToken", "nodeName", "hostNetwork",
             "hostPID", "hostIPC", "shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname",
             "subdomain", "affinity", "schedulerName", "tolerations", "hostAliases", "priorityClassName",
             "priority", "dnsConfig", "readinessGates", "runtimeClassName", "enableServiceLinks",
             "preemptionPolicy", "overhead", "topologySpreadConstraints", "setHostnameAsFQDN", "os", "hostUsers",
             "schedulingGates", "resourceClaims", "resources", "hostnameOverride")
_POD_STATUS = ("observedGeneration", "phase", "conditions", "message", "reason", "nominatedNodeName", "hostIP",
               "hostIPs", "podIP", "podIPs", "startTime", "initContainerStatuses", "containerStatuses", "qosClass",
               "ephemeralContainerStatuses", "resize", "resourceClaimStatuses", "extendedResourceClaimStatus")
_NODE_SPEC = ("podCIDR", "podCIDRs", "providerID", "unschedulable", "taints", "configSource", "externalID")
_NODE_STATUS = ("capacity", "allocatable", "phase", "conditions", "addresses", "daemonEndpoints", "nodeInfo",
                "images", "volumesInUse", "volumesAttached", "config", "runtimeHandlers", "features")

#: by (group, kind), the levels of an object parsed as records and the fields each may hold: every
#: field the Kubernetes API defines there. tensor-fusion's kinds take theirs from their CRDs
#: (`_custom_levels`); other kinds are decoded whole.
LEVELS: Mapping[tuple[str, str], Mapping[tuple[str, ...], tuple[str, ...]]] = {
    ("", "Pod"): {(): _OBJECT, ("metadata",): _OBJECT_META, ("spec",): _POD_SPEC, ("status",): _POD_STATUS},
    ("", "Node"): {(): _OBJECT, ("metadata",): _OBJECT_META, ("spec",): _NODE_SPEC, ("status",): _NODE_STATUS},
    ("", "Namespace"): {(): _OBJECT, ("metadata",): _OBJECT_META},
}


def _custom_levels(kind: str) -> dict[tuple[str, ...], tuple[str, ...]]:
    """A tensor-fusion kind's levels: its spec and status where the CRD lists their fields and keeps
    no others (the API server drops a field a structural schema does not list)."""
    levels: dict[tuple[str, ...], tuple[str, ...]] = {(): _OBJECT, ("metadata",): _OBJECT_META}
    for part in ("spec", "status"):
        schema = section(openapi_schema_view(kind), "properties", part)
        fields = tuple(section(schema, "properties"))
        if fields and schema.get("x-kubernetes-preserve-unknown-fields") is not True:
            levels[(part,)] = fields
    return levels


# how a record's field becomes the cached value (a field not named in a level's rules is interned)
_SKIP, _RECORD, _RAW, _RAW_ITEMS, _COPY = range(5)
#: by field, what to do with it and with which rules
_Rules = dict[str, tuple[int, Any]]


class PrunedDecoder:
    """Decodes one kind's list pages and watch events into objects already through a Pruner (see
    above)."""

    def __init__(self, pruner: Pruner, kind: str, levels: Mapping[tuple[str, ...], tuple[str, ...]]) -> None:
        self.pruner = pruner
        record, self._rules = self._compile(kind, (), levels, pruner.tree)
        items: Any = list[record] | None  # type: ignore[valid-type]
        obj: Any = record | None
        self._pages = msgspec.json.Decoder(msgspec.defstruct(f"{kind}Page", [("metadata", Any, UNSET),
                                                                             ("items", items, None)]))
        self._events = msgspec.json.Decoder(msgspec.defstruct(f"{kind}Event", [("type", str, ""),
                                                                               ("object", obj, None)]))

    def _compile(self, kind: str, path: tuple[str, ...], levels: Mapping[tuple[str, ...], tuple[str, ...]],
                 tree: _Tree) -> tuple[type[msgspec.Struct], _Rules]:
        """The record of the level at `path` and its rules."""
        fields: list[tuple[str, Any, Any]] = []
        rules: _Rules = {}
        for name in levels[path]:
            below = tree.get(name, {})
            kind_of: Any = Any
            if below is DROP:
                kind_of, rules[name] = msgspec.Raw, (_SKIP, None)
            elif (*path, name) in levels:
                record, inner = self._compile(kind, (*path, name), levels, below)
                kind_of, rules[name] = record | None, (_RECORD, inner)
            elif _SHARE in below:
                kind_of, rules[name] = msgspec.Raw, (_RAW, (self._tag((*path, name), below), below))
            elif _SHARE in below.get("[]", {}):
                items = below["[]"]
                tag = self._tag((*path, name, "[]"), items)
                kind_of, rules[name] = list[msgspec.Raw] | None, (_RAW_ITEMS, (tag, items))
            elif below:
                rules[name] = (_COPY, below)
            fields.append((name, kind_of, UNSET))
        record = msgspec.defstruct(f"{kind}{''.join(p.title() for p in path)}", fields, forbid_unknown_fields=True)
        return record, rules

    def _tag(self, path: tuple[str, ...], tree: _Tree) -> bytes:
        """The prefix of a shared subtree's key: its path and its rules, so that the same JSON
        pruned by other rules (at another path, or by another Pruner) is kept apart."""
        rules = hashlib.blake2b(orjson.dumps(tree, option=orjson.OPT_SORT_KEYS), digest_size=6).hexdigest()
        tag = f"{'.'.join(path)}:{rules}".encode() + b"\x00"
        self.pruner.table.rules[tag] = (self.pruner, tree)
        return tag

    def page(self, content: bytes) -> dict[str, Any]:
        """The list's JSON as a dict whose items are pruned. Raises ValueError for a body that is
        not a JSON list of objects."""
        try:
            page: Any = self._pages.decode(content)
        except msgspec.ValidationError:  # a field no record knows, or one of another type: decode whole
            whole = orjson.loads(content)
            listed = whole.get("items") if isinstance(whole, dict) else 0
            if not (listed is None or (isinstance(listed, list) and all(isinstance(o, dict) for o in listed))):
                raise ValueError("not a list of objects") from None
            return {**whole, "items": [self.pruner(obj) for obj in listed or ()]}
        out: dict[str, Any] = {"metadata": page.metadata} if page.metadata is not UNSET else {}
        out["items"] = [self._object(item, self._rules) for item in page.items or ()]
        return out

    def event(self, line: str | bytes) -> tuple[str, Any]:
        """A watch event's type and object; the object pruned when the event carries one (ADDED,
        MODIFIED, DELETED), as the server sent it otherwise (an ERROR's Status, a BOOKMARK).
        Raises ValueError for a line that is not JSON."""
        try:
            event: Any = self._events.decode(line)
        except msgspec.ValidationError:  # a field no record knows, or another shape (an ERROR's Status)
            whole = orjson.loads(line)
            kind = str(whole.get("type") or "") if isinstance(whole, dict) else ""
            obj = whole.get("object") if isinstance(whole, dict) else None
            if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                obj = self.pruner(obj)
            return kind, obj
        return event.type, None if event.object is None else self._object(event.object, self._rules)

    def _object(self, record: msgspec.Struct, rules: _Rules) -> dict[str, Any]:
        out: dict[str, Any] = {}
        pruner = self.pruner
        for name, value in msgspec.structs.asdict(record).items():
            if value is UNSET:
                continue
            rule = rules.get(name)
            if rule is None:
                out[name] = _value(value)
                continue
            step, arg = rule
            if step == _SKIP:
                continue
            if step == _COPY:
                out[name] = pruner._copy(value, arg)
            elif value is None:
                out[name] = None
            elif step == _RECORD:
                out[name] = self._object(value, arg)
            elif step == _RAW:
                out[name] = pruner.shared_raw(arg[0], value, arg[1])
            else:
                out[name] = [pruner.shared_raw(arg[0], item, arg[1]) for item in value]
        return out


def pruned_decoder(resource: r.ApiResource, transform: Transform) -> PrunedDecoder | None:
    """How an informer with `transform` decodes `resource`'s list pages and watch events: into
    objects already transformed, when the transform is a Pruner that drops managedFields and the
    kind's fields are known (`LEVELS`, tensor-fusion's CRDs); None to decode them whole and
    transform each object."""
    if not (isinstance(transform, Pruner) and transform.drops(("metadata", "managedFields"))):
        return None
    if resource.group == r.TF_GROUP:
        return transform.decoder(resource.kind, lambda: _custom_levels(resource.kind))
    levels = LEVELS.get((resource.group, resource.kind))
    return None if levels is None else transform.decoder(resource.kind, lambda: levels)
