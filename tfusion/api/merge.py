"""Kubernetes strategic merge patch (`application/strategic-merge-patch+json`) over plain JSON values.

Strategic merge needs to know, per field, whether a list is merged by a key or replaced whole;
kube-apiserver reads that from the Go struct tags (`patchStrategy`, `patchMergeKey`) of the typed
objects. We have no Go types, so the tags of the built-in kinds are transcribed into the
`_KIND_SCHEMAS` table below. Custom resources have no such tags: kube-apiserver answers 415
UnsupportedMediaType for a strategic merge patch on them, and so must the caller of this module
(`strategic_merge_patch` raises `PatchError` for a kind it does not know).

It lives in `api/`, below every layer, because two sides apply the same patches: the embedded API
server (PATCH requests) and the controller (the webhook's pod patches, worker templates). The
JSON merge patch and JSON patch flavours, which only the API server serves, stay in
`apiserver/patch.py`.

Every function returns a new value and leaves its inputs untouched. Errors raise `PatchError`
(a `ValueError`) with a message naming the path at fault; callers answer 422/400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["STRATEGIC_MERGE_KINDS", "PatchError", "clone", "merge_patch_from", "strategic_merge_patch"]


class PatchError(ValueError):
    """A patch that cannot be applied to the target: malformed, or failing against the document."""


def clone(value: Any) -> Any:
    """Deep copy of a JSON value; several times faster than copy.deepcopy for this shape."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


def merge_patch_from(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns the object `before` into `after`: a member `after` lacks is
    null, objects on both sides are diffed member by member, anything else changed is sent whole
    (lists included, as merge patches replace them). `after` must hold no nulls (a merge patch
    cannot say "set to null")."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            inner = merge_patch_from(old, value)
            if inner:
                patch[key] = inner
        elif key not in before or old != value:
            patch[key] = value
    return patch


@dataclass(frozen=True)
class _Field:
    """What the Go struct tags say about one field: its patch strategy and merge key, plus the
    schema of its value (for a map field) or of its items (for a list field)."""

    strategy: frozenset[str] = frozenset()
    merge_key: str = ""
    sub: Mapping[str, _Field] = field(default_factory=dict)

    @property
    def merges(self) -> bool:
        return "merge" in self.strategy


_Schema = Mapping[str, _Field]


def _nested(sub: _Schema) -> _Field:
    return _Field(sub=sub)


def _merged_list(key: str, sub: _Schema | None = None, *, retain_keys: bool = False) -> _Field:
    strategy = frozenset({"merge", "retainKeys"} if retain_keys else {"merge"})
    return _Field(strategy=strategy, merge_key=key, sub=sub or {})


_SET = _Field(strategy=frozenset({"merge"}))  # list of primitives merged as an ordered set

_OBJECT_META: _Schema = {"finalizers": _SET, "ownerReferences": _merged_list("uid")}

_CONTAINER: _Schema = {
    "ports": _merged_list("containerPort"),
    "env": _merged_list("name"),
    "volumeMounts": _merged_list("mountPath"),
    "volumeDevices": _merged_list("devicePath"),
}

_POD_SPEC: _Schema = {
    "volumes": _merged_list("name", retain_keys=True),
    "initContainers": _merged_list("name", _CONTAINER),
    "containers": _merged_list("name", _CONTAINER),
    "ephemeralContainers": _merged_list("name", _CONTAINER),
    "imagePullSecrets": _merged_list("name"),
    "hostAliases": _merged_list("ip"),
    "topologySpreadConstraints": _merged_list("topologyKey"),
    "resourceClaims": _merged_list("name", retain_keys=True),
    "schedulingGates": _merged_list("name"),
}

_POD_STATUS: _Schema = {
    "conditions": _merged_list("type"),
    "podIPs": _merged_list("ip"),
    "hostIPs": _merged_list("ip"),
    "resourceClaimStatuses": _merged_list("name", retain_keys=True),
}

_CONDITIONS_STATUS: _Schema = {"conditions": _merged_list("type")}

_METADATA_ONLY: _Schema = {"metadata": _nested(_OBJECT_META)}

_POD_TEMPLATE: _Field = _nested({"metadata": _nested(_OBJECT_META), "spec": _nested(_POD_SPEC)})

#: Deployment, ReplicaSet, Job, DaemonSet and StatefulSet: a pod template in the spec, conditions
#: (merged by type) in the status
_WORKLOAD: _Schema = {
    "metadata": _nested(_OBJECT_META),
    "spec": _nested({"template": _POD_TEMPLATE}),
    "status": _nested(_CONDITIONS_STATUS),
}

#: a CronJob's pod template sits one Job template deeper; its status lists (active) carry no tag
_CRON_JOB: _Schema = {
    "metadata": _nested(_OBJECT_META),
    "spec": _nested({"jobTemplate": _nested({"metadata": _nested(_OBJECT_META),
                                             "spec": _nested({"template": _POD_TEMPLATE})})}),
}

#: both webhook configurations merge their webhooks by name, and each webhook its matchConditions
_WEBHOOK_CONFIGURATION: _Schema = {
    "metadata": _nested(_OBJECT_META),
    "webhooks": _merged_list("name", {"matchConditions": _merged_list("name")}),
}

#: kinds whose own lists carry no patch tag at all (an RBAC Role's rules, a binding's subjects, a
#: NetworkPolicy's ingress rules, an EndpointSlice's endpoints, ...): each list is replaced whole
#: (atomic), only the object metadata merges
_ATOMIC_LISTS = _METADATA_ONLY

# Transcribed from the patchStrategy/patchMergeKey tags of k8s.io/api for the kinds we serve.
# Lists not named here (tolerations, taints, containerStatuses, envFrom, ...) carry no tag there
# and are replaced whole, as kube-apiserver does.
_KIND_SCHEMAS: Mapping[str, _Schema] = {
    "Pod": {
        "metadata": _nested(_OBJECT_META),
        "spec": _nested(_POD_SPEC),
        "status": _nested(_POD_STATUS),
    },
    "Node": {
        "metadata": _nested(_OBJECT_META),
        "spec": _nested({"podCIDRs": _SET}),
        "status": _nested({"conditions": _merged_list("type"), "addresses": _merged_list("type")}),
    },
    "Service": {
        "metadata": _nested(_OBJECT_META),
        "spec": _nested({"ports": _merged_list("port")}),
        "status": _nested(_CONDITIONS_STATUS),
    },
    "Namespace": {"metadata": _nested(_OBJECT_META), "status": _nested(_CONDITIONS_STATUS)},
    "ServiceAccount": {"metadata": _nested(_OBJECT_META), "secrets": _merged_list("name")},
    "MutatingWebhookConfiguration": _WEBHOOK_CONFIGURATION,
    "ValidatingWebhookConfiguration": _WEBHOOK_CONFIGURATION,
    "ValidatingAdmissionPolicy": {
        "metadata": _nested(_OBJECT_META),
        "spec": _nested({"matchConditions": _merged_list("name")}),
        "status": _nested(_CONDITIONS_STATUS),
    },
    "ValidatingAdmissionPolicyBinding": _METADATA_ONLY,
    "Deployment": _WORKLOAD,
    "ReplicaSet": _WORKLOAD,
    "Job": _WORKLOAD,
    "DaemonSet": _WORKLOAD,
    "StatefulSet": _WORKLOAD,
    "CronJob": _CRON_JOB,
    "ControllerRevision": _METADATA_ONLY,
    "PersistentVolumeClaim": {"metadata": _nested(_OBJECT_META), "status": _nested(_CONDITIONS_STATUS)},
    "PodDisruptionBudget": {"metadata": _nested(_OBJECT_META), "status": _nested(_CONDITIONS_STATUS)},
    "NetworkPolicy": _ATOMIC_LISTS,
    "Endpoints": _ATOMIC_LISTS,
    "EndpointSlice": _ATOMIC_LISTS,
    "Role": _ATOMIC_LISTS,
    "ClusterRole": _ATOMIC_LISTS,
    "RoleBinding": _ATOMIC_LISTS,
    "ClusterRoleBinding": _ATOMIC_LISTS,
    "ConfigMap": _METADATA_ONLY,
    "Secret": _METADATA_ONLY,
    "Event": _METADATA_ONLY,
    "Lease": _METADATA_ONLY,
    "PriorityClass": _METADATA_ONLY,
    "CustomResourceDefinition": _METADATA_ONLY,
    "TokenReview": _METADATA_ONLY,
}

STRATEGIC_MERGE_KINDS: frozenset[str] = frozenset(_KIND_SCHEMAS)

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"


def strategic_merge_patch(target: Any, patch: Any, kind: str, *, owned: bool = False) -> Any:
    """Apply a Kubernetes strategic merge patch to an object of built-in `kind`.

    With `owned`, the caller hands over `target` (a private copy no one else reads): it is patched in
    place instead of copied first.

    Raises PatchError for a kind without strategic-merge metadata (custom resources: the caller
    answers 415 before getting here) and for malformed directives.
    """
    schema = _KIND_SCHEMAS.get(kind)
    if schema is None:
        raise PatchError(
            f"strategic merge patch is not supported for kind {kind!r}; "
            "use a JSON merge patch (application/merge-patch+json) or a JSON patch"
        )
    if not isinstance(patch, dict):
        raise PatchError(f"a strategic merge patch must be a JSON object, got {type(patch).__name__}")
    if not isinstance(target, dict):
        base: dict[str, Any] = {}
    else:
        base = target if owned else clone(target)
    return _merge_map(base, patch, schema, "")


def _merge_map(original: dict[str, Any], patch: Mapping[str, Any], schema: _Schema, at: str) -> Any:
    """Merge `patch` into `original` (which this function owns and may mutate)."""
    directive = patch.get(_DIRECTIVE)
    if directive is not None:
        if directive == "replace":
            return _merge_map({}, {k: v for k, v in patch.items() if k != _DIRECTIVE}, schema, at)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise PatchError(f"{at or '/'}: unknown $patch directive {directive!r}; allowed: replace, delete, merge")
    orders: dict[str, list[Any]] = {}
    live_lists = {k[len(_SET_ORDER) :]: original.get(k[len(_SET_ORDER) :]) for k in patch if k.startswith(_SET_ORDER)}
    if _RETAIN_KEYS in patch:
        _retain_keys(original, patch, at)
    for key, value in patch.items():
        if key.startswith(_DELETE_PRIMITIVES):
            _delete_from_primitive_list(original, key[len(_DELETE_PRIMITIVES) :], value, at)
        elif key.startswith(_SET_ORDER):
            if not isinstance(value, list):
                raise PatchError(f"{at}/{key}: must be a list, got {type(value).__name__}")
            orders[key[len(_SET_ORDER) :]] = value
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            original.pop(key, None)
            continue
        spec = schema.get(key, _Field())
        original[key] = _merge_value(original.get(key), value, spec, f"{at}/{key}")
    for key, order in orders.items():
        if isinstance(original.get(key), list):
            spec = schema.get(key, _Field())
            live = live_lists.get(key)
            original[key] = _apply_element_order(
                original[key],
                order,
                patch.get(key),
                live if isinstance(live, list) else [],
                spec,
                f"{at}/{key}",
            )
    return original


def _merge_value(current: Any, value: Any, spec: _Field, at: str) -> Any:
    if isinstance(value, dict):
        base = current if isinstance(current, dict) else {}
        return _merge_map(base, value, spec.sub, at)
    if isinstance(value, list):
        if spec.merges and isinstance(current, list):
            return _merge_list(current, value, spec, at)
        # a replaced list (or one new to the object) still loses its directives and deletions
        return _merge_list([], value, spec, at) if spec.merges else _strip_directives(value, spec, at)
    return value


def _strip_directives(items: list[Any], spec: _Field, at: str) -> list[Any]:
    return [
        _merge_map({}, item, spec.sub, f"{at}[{i}]") if isinstance(item, dict) else item for i, item in enumerate(items)
    ]


def _retain_keys(original: dict[str, Any], patch: Mapping[str, Any], at: str) -> None:
    keep = patch[_RETAIN_KEYS]
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise PatchError(f"{at}/$retainKeys: must be a list of field names")
    missing = [k for k in patch if not k.startswith("$") and k not in keep]
    if missing:
        raise PatchError(f"{at}/$retainKeys: does not list field(s) the patch sets: {', '.join(missing)}")
    for key in [k for k in original if k not in keep]:
        del original[key]


def _delete_from_primitive_list(original: dict[str, Any], key: str, values: Any, at: str) -> None:
    if not isinstance(values, list):
        raise PatchError(f"{at}/$deleteFromPrimitiveList/{key}: must be a list, got {type(values).__name__}")
    current = original.get(key)
    if current is None:
        return
    if not isinstance(current, list) or any(isinstance(v, dict | list) for v in current):
        raise PatchError(f"{at}/{key}: $deleteFromPrimitiveList applies only to a list of primitives")
    doomed = {_scalar_key(v) for v in values}
    original[key] = [v for v in current if _scalar_key(v) not in doomed]


def _scalar_key(value: Any) -> tuple[str, Any]:
    """Hashable identity of a primitive that keeps true and 1 apart (objects and lists, which a
    malformed patch may put in a list of primitives, by their JSON text)."""
    if isinstance(value, dict | list):
        return ("json", orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    return (type(value).__name__ if isinstance(value, bool) else "v", value)


def _merge_key_of(item: Any, spec: _Field, at: str) -> tuple[str, Any]:
    if not isinstance(item, dict):
        raise PatchError(f"{at}: list items must be objects (merge key {spec.merge_key!r}), got {item!r}")
    if spec.merge_key not in item:
        raise PatchError(f"{at}: item {item!r} does not contain the merge key {spec.merge_key!r}")
    value = item[spec.merge_key]
    if isinstance(value, dict | list):
        raise PatchError(f"{at}: merge key {spec.merge_key!r} must be a primitive, got {value!r}")
    return _scalar_key(value)


def _merge_list(original: list[Any], patch: list[Any], spec: _Field, at: str) -> list[Any]:
    """Merge a patch list into a list whose field is tagged patchStrategy=merge."""
    if not patch:
        return original
    if not any(isinstance(p, dict) for p in patch) and not any(isinstance(o, dict) for o in original):
        merged = list(original)
        seen = {_scalar_key(v) for v in merged}
        for value in patch:
            k = _scalar_key(value)
            if k not in seen:
                seen.add(k)
                merged.append(value)
        return _normalize_order(merged, patch, original, _scalar_key)
    if not spec.merge_key:
        raise PatchError(f"{at}: cannot merge a list of objects without a merge key")
    original, patch = _apply_list_directives(original, patch, spec, at)

    def key_of(item: Any) -> tuple[str, Any]:
        return _merge_key_of(item, spec, at)

    merged = list(original)
    positions = {key_of(item): i for i, item in enumerate(merged)}
    for i, item in enumerate(patch):
        k = key_of(item)
        where = positions.get(k)
        if where is None:
            positions[k] = len(merged)
            merged.append(_merge_map({}, item, spec.sub, f"{at}[{i}]"))
        else:
            merged[where] = _merge_map(merged[where], item, spec.sub, f"{at}[{i}]")
    return _normalize_order(merged, patch, original, key_of)


def _apply_list_directives(original: list[Any], patch: list[Any], spec: _Field, at: str) -> tuple[list[Any], list[Any]]:
    """Handle `$patch` items in a merged list of objects: replace the list or delete entries."""
    plain: list[Any] = []
    doomed: set[tuple[str, Any]] = set()
    replace = False
    for i, item in enumerate(patch):
        directive = item.get(_DIRECTIVE) if isinstance(item, dict) else None
        if directive is None:
            plain.append(item)
        elif directive == "replace":
            replace = True
        elif directive == "delete":
            doomed.add(_merge_key_of(item, spec, f"{at}[{i}]"))
        elif directive == "merge":
            raise PatchError(f"{at}[{i}]: $patch: merge cannot be used inside a list (kube-apiserver refuses it)")
        else:
            raise PatchError(f"{at}[{i}]: unknown $patch directive {directive!r} in a list; allowed: replace, delete")
    if replace:
        return [], plain
    if doomed:
        # like kube-apiserver, a delete removes live entries; a plain entry in the same patch stays
        original = [o for o in original if _merge_key_of(o, spec, at) not in doomed]
    return original, plain


def _apply_element_order(
    merged: list[Any], order: list[Any], patch_list: Any, live: list[Any], spec: _Field, at: str
) -> list[Any]:
    """Honour `$setElementOrder/<field>`: the listed items in that order, the others placed by
    their position in the live list (see _normalize_order)."""
    if all(not isinstance(o, dict) for o in order) and all(not isinstance(m, dict) for m in merged):
        key_of: Callable[[Any], tuple[str, Any]] = _scalar_key
    else:

        def key_of(item: Any) -> tuple[str, Any]:
            return _merge_key_of(item, spec, f"$setElementOrder{at}")

    rank = {key_of(o): i for i, o in enumerate(order)}
    if isinstance(patch_list, list):
        last = -1
        for item in patch_list:
            if isinstance(item, dict) and item.get(_DIRECTIVE) is not None:
                continue
            position = rank.get(key_of(item))
            if position is None:
                raise PatchError(f"{at}: item {item!r} is in the patch but not in $setElementOrder")
            if position < last:
                raise PatchError(f"{at}: the patch list and $setElementOrder disagree on the order")
            last = position
    return _normalize_order(merged, order, live, key_of)


def _normalize_order(
    merged: list[Any],
    patch_order: list[Any],
    server_order: list[Any],
    key_of: Callable[[Any], tuple[str, Any]],
) -> list[Any]:
    """Order a merged list as kube-apiserver does: patch items in patch order, interleaved with
    the server-only items by their position in the live list; an item new to the list goes
    before the server-only items that follow the previous patch item."""
    patch_rank: dict[tuple[str, Any], int] = {}
    for i, item in enumerate(patch_order):
        if not (isinstance(item, dict) and _DIRECTIVE in item):
            patch_rank.setdefault(key_of(item), i)
    server_rank: dict[tuple[str, Any], int] = {}
    for i, item in enumerate(server_order):
        server_rank.setdefault(key_of(item), i)
    from_patch = sorted((m for m in merged if key_of(m) in patch_rank), key=lambda m: patch_rank[key_of(m)])
    server_only = [m for m in merged if key_of(m) not in patch_rank]
    result: list[Any] = []
    i = j = 0
    while i < len(server_only) and j < len(from_patch):
        left = server_rank.get(key_of(server_only[i]), -1)
        right = server_rank.get(key_of(from_patch[j]), -1)
        if left >= 0 and right >= 0 and left < right:
            result.append(server_only[i])
            i += 1
        else:
            result.append(from_patch[j])
            j += 1
    result.extend(server_only[i:])
    result.extend(from_patch[j:])
    return result
