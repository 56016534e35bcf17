"""What an informer keeps of each object: the transforms applied before an object enters the cache.

Why: a controller that caches 100,000 pods as decoded JSON pays for every field the API server
sends, most of which no reader here ever looks at, and for one copy of every repeated string
("tensor-fusion.ai/gpupool", "Running", a pool's name, a node's name) per object. controller-runtime
users strip managedFields with a cache transform for the same reason; this module does that, drops
the fields of a kind that the controller does not read (`PRUNED`), and interns the keys and short
values so that objects share them.

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
}


def strip_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Who owns which field is the API server's business; it roughly doubles an object. A write
    built from a cached object sends no managedFields, which the API server reads as "keep them"."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


#: a compiled set of paths: key -> DROP, or the tree below that key ("[]" for a list's items)
_Tree = dict[str, Any]
DROP = None


def _compile(paths: tuple[tuple[str, ...], ...]) -> _Tree:
    tree: _Tree = {}
    for path in paths:
        node = tree
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = DROP
    return tree


def _copy(node: Any, tree: _Tree | None) -> Any:
    """A copy of `node` with the strings up to INTERN_MAX_LEN interned and, where `tree` says,
    keys dropped: one walk, since a cached object is transformed on every watch event. Keys are
    not interned here: orjson, which decodes every answer, already shares them between objects."""
    kind = type(node)
    if kind is dict:
        if tree is None:
            return {k: _value(v) for k, v in node.items()}
        out = {}
        for k, v in node.items():
            if k in tree:
                below = tree[k]
                if below is not DROP:
                    out[k] = _copy(v, below)
            else:
                out[k] = _value(v)
        return out
    if kind is list:
        items = tree.get("[]") if tree is not None else None
        return [_copy(v, items) for v in node]
    return _value(node)


def _value(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return _intern(value) if len(value) <= INTERN_MAX_LEN else value
    if kind is dict:
        return {k: _value(v) for k, v in value.items()}
    if kind is list:
        return [_value(v) for v in value]
    return value


_intern = sys.intern


def prune(paths: tuple[tuple[str, ...], ...]) -> Transform:
    """Drop `paths` and intern what is left (see `_copy`)."""
    tree = _compile(paths)

    def transform(obj: dict[str, Any]) -> dict[str, Any]:
        result = _copy(obj, tree)
        assert isinstance(result, dict)
        return result

    return transform


def intern_strings(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` whose short string values are interned: every cached object then shares
    one "pool-0", one "node-0042", one "Running", one "100m"."""
    result = _value(obj)
    assert isinstance(result, dict)
    return result


def transform_for(resource: r.ApiResource, *, pruning: bool = True) -> Transform:
    """The cache transform of `resource`: managedFields stripped, the kind's unread fields dropped
    (with `pruning`), short values interned; one copy of the object."""
    paths = PRUNED.get(resource.kind, ()) if pruning else ()
    return prune((("metadata", "managedFields"), *paths))


#: what an informer keeps when nobody asked for pruning: managedFields never, repeated strings once
DEFAULT_TRANSFORM: Transform = prune((("metadata", "managedFields"),))
