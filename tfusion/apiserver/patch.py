"""The three PATCH flavours kube-apiserver accepts, over plain JSON values.

- `merge_patch`: JSON merge patch (RFC 7386), `application/merge-patch+json`.
- `json_patch`: JSON patch (RFC 6902), `application/json-patch+json`.
- `strategic_merge_patch`: Kubernetes strategic merge patch,
  `application/strategic-merge-patch+json`, for the built-in kinds this server serves.

Strategic merge needs to know, per field, whether a list is merged by a key or replaced whole;
kube-apiserver reads that from the Go struct tags (`patchStrategy`, `patchMergeKey`) of the typed
objects. We have no Go types, so the tags of the kinds we serve are transcribed into the
`_KIND_SCHEMAS` table below. Custom resources have no such tags: kube-apiserver answers 415
UnsupportedMediaType for a strategic merge patch on them, and so must the caller of this module
(`strategic_merge_patch` raises `PatchError` for a kind it does not know).

Every function returns a new value and leaves its inputs untouched. Errors raise `PatchError`
(a `ValueError`) with a message naming the operation and path at fault; callers answer 422/400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "STRATEGIC_MERGE_KINDS",
    "PatchError",
    "PatchTooLarge",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]


class PatchError(ValueError):
    """A patch that cannot be applied to the target: malformed, or failing against the document."""


class PatchTooLarge(PatchError):
    """Applying the patch would make the document larger than the caller's limit (`size` bytes)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


def _clone(value: Any) -> Any:
    """Deep copy of a JSON value; several times faster than copy.deepcopy for this shape."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ==, true is not 1 and 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


# ---------------------------------------------------------------------------------------------
# RFC 7386 JSON merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch: objects merge recursively, null deletes, all else replaces."""
    if not isinstance(patch, dict):
        return _clone(patch)
    result: dict[str, Any] = _clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------------------------------
# RFC 6902 JSON patch

_JSON_PATCH_OPS = ("add", "remove", "replace", "move", "copy", "test")


class _OpFailed(Exception):
    """Internal: one op failed; json_patch adds the op index and path to the message."""


def _parse_pointer(pointer: Any, what: str) -> list[str]:
    if not isinstance(pointer, str):
        raise _OpFailed(f"{what} must be a string JSON pointer, got {type(pointer).__name__}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise _OpFailed(f"{what} {pointer!r} is not a JSON pointer: it must be empty or start with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        rest = token.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise _OpFailed(f"{what} {pointer!r} has an invalid escape: '~' must be followed by 0 or 1")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


def _array_index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-":
        if allow_end:
            return length
        raise _OpFailed("index '-' (end of array) is only valid for add")
    if not token.isdigit() or (len(token) > 1 and token[0] == "0") or not token.isascii():
        raise _OpFailed(f"array index {token!r} is not a non-negative integer")
    index = int(token)
    limit = length if allow_end else length - 1
    if index > limit:
        raise _OpFailed(f"array index {index} out of range (length {length})")
    return index


def _walk(doc: Any, tokens: Sequence[str]) -> Any:
    """The value at `tokens`; raises _OpFailed('path not found') if any step is missing."""
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise _OpFailed("path not found")
            node = node[token]
        elif isinstance(node, list):
            try:
                node = node[_array_index(token, len(node), allow_end=False)]
            except _OpFailed as exc:
                raise _OpFailed(f"path not found: {exc}") from None
        else:
            raise _OpFailed("path not found")
    return node


def _container(doc: Any, tokens: Sequence[str]) -> Any:
    parent = _walk(doc, tokens[:-1])
    if not isinstance(parent, dict | list):
        raise _OpFailed("path not found: parent is not an object or array")
    return parent


def _add(doc: Any, tokens: Sequence[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _container(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    else:
        parent.insert(_array_index(tokens[-1], len(parent), allow_end=True), value)
    return doc


def _remove(doc: Any, tokens: Sequence[str]) -> tuple[Any, Any]:
    """Remove the value at tokens; returns (doc, removed value)."""
    if not tokens:
        raise _OpFailed("cannot remove the whole document")
    parent = _container(doc, tokens)
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise _OpFailed("path not found")
        return doc, parent.pop(tokens[-1])
    try:
        index = _array_index(tokens[-1], len(parent), allow_end=False)
    except _OpFailed as exc:
        raise _OpFailed(f"path not found: {exc}") from None
    return doc, parent.pop(index)


def _replace(doc: Any, tokens: Sequence[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _container(doc, tokens)
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise _OpFailed("path not found")
        parent[tokens[-1]] = value
    else:
        try:
            index = _array_index(tokens[-1], len(parent), allow_end=False)
        except _OpFailed as exc:
            raise _OpFailed(f"path not found: {exc}") from None
        parent[index] = value
    return doc


def _value_of(op: Mapping[str, Any]) -> Any:
    if "value" not in op:
        raise _OpFailed("missing required member 'value'")
    return _clone(op["value"])


def _apply_op(doc: Any, op: Mapping[str, Any]) -> Any:
    name = op["op"]
    tokens = _parse_pointer(op["path"], "path")
    if name == "add":
        return _add(doc, tokens, _value_of(op))
    if name == "remove":
        return _remove(doc, tokens)[0]
    if name == "replace":
        return _replace(doc, tokens, _value_of(op))
    if name == "test":
        expected = _value_of(op)
        actual = _walk(doc, tokens)
        if not _json_equal(actual, expected):
            raise _OpFailed(f"test failed: value is {actual!r}, expected {expected!r}")
        return doc
    if "from" not in op:
        raise _OpFailed("missing required member 'from'")
    source = _parse_pointer(op["from"], "from")
    if name == "copy":
        return _add(doc, tokens, _clone(_walk(doc, source)))
    # move
    if tokens[: len(source)] == source and len(tokens) > len(source):
        raise _OpFailed(f"cannot move {op['from']!r} into its own child")
    if tokens == source:
        _walk(doc, source)
        return doc
    doc, value = _remove(doc, source)
    return _add(doc, tokens, value)


def json_patch(target: Any, ops: Any, *, max_bytes: int | None = None) -> Any:
    """Apply an RFC 6902 JSON patch (a list of operations) and return the patched copy.

    With `max_bytes`, the document's JSON size is kept under it while the ops run: `copy` and `add`
    can double a document per op, so checking only the result would let a short patch build
    gigabytes first. Raises PatchTooLarge at the first op that crosses the limit.
    """
    if not isinstance(ops, list):
        raise PatchError(f"a JSON patch must be a list of operations, got {type(ops).__name__}")
    doc = _clone(target)
    budget = _SizeBudget(doc, max_bytes) if max_bytes is not None else None
    for index, op in enumerate(ops):
        if not isinstance(op, dict):
            raise PatchError(f"op {index}: must be an object, got {type(op).__name__}")
        name, path = op.get("op"), op.get("path")
        label = f"op {index} ({name} {path})"
        if name not in _JSON_PATCH_OPS:
            raise PatchError(f"{label}: unknown op {name!r}; allowed: {', '.join(_JSON_PATCH_OPS)}")
        if "path" not in op:
            raise PatchError(f"{label}: missing required member 'path'")
        try:
            doc = _apply_op(doc, op)
            if budget is not None and name in ("add", "copy", "replace", "move"):
                budget.grew(doc, op, label)
        except _OpFailed as exc:
            raise PatchError(f"{label}: {exc}") from None
        except RecursionError:
            raise PatchError(f"{label}: the document becomes too deeply nested") from None
    return doc


class _SizeBudget:
    """An upper estimate of a document's JSON size, made exact whenever it crosses the limit."""

    def __init__(self, doc: Any, limit: int) -> None:
        self.limit = limit
        self.estimate = self._exact(doc, "the target")

    def grew(self, doc: Any, op: Mapping[str, Any], label: str) -> None:
        if op["op"] == "copy":
            added = self._exact(_walk(doc, _parse_pointer(op["from"], "from")), label)
        elif op["op"] == "move":
            added = 0
        else:
            added = self._exact(op.get("value"), label)
        self.estimate += added
        if self.estimate > self.limit:
            self.estimate = self._exact(doc, label)
            if self.estimate > self.limit:
                raise PatchTooLarge(f"{label}: the object would grow to {self.estimate} bytes", self.estimate)

    def _exact(self, value: Any, label: str) -> int:
        try:
            return len(orjson.dumps(value))
        except orjson.JSONEncodeError:
            raise PatchError(f"{label}: the document becomes too deeply nested") from None


# ---------------------------------------------------------------------------------------------
# Kubernetes strategic merge patch


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

#: Deployment, ReplicaSet and Job: a pod template in the spec, conditions (merged by type) in the status
_WORKLOAD: _Schema = {
    "metadata": _nested(_OBJECT_META),
    "spec": _nested({"template": _nested({"metadata": _nested(_OBJECT_META), "spec": _nested(_POD_SPEC)})}),
    "status": _nested(_CONDITIONS_STATUS),
}

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
    "MutatingWebhookConfiguration": {
        "metadata": _nested(_OBJECT_META),
        "webhooks": _merged_list("name"),
    },
    "ValidatingAdmissionPolicy": {
        "metadata": _nested(_OBJECT_META),
        "spec": _nested({"matchConditions": _merged_list("name")}),
        "status": _nested(_CONDITIONS_STATUS),
    },
    "ValidatingAdmissionPolicyBinding": _METADATA_ONLY,
    "Deployment": _WORKLOAD,
    "ReplicaSet": _WORKLOAD,
    "Job": _WORKLOAD,
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


def strategic_merge_patch(target: Any, patch: Any, kind: str) -> Any:
    """Apply a Kubernetes strategic merge patch to an object of built-in `kind`.

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
    base = _clone(target) if isinstance(target, dict) else {}
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
