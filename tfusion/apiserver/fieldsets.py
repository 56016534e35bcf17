"""Sets of field paths, the unit of ownership in server-side apply.

kube-apiserver records which manager owns which fields of an object (`metadata.managedFields`) as
sets of paths in its "FieldsV1" encoding: `f:<name>` steps into a field, `k:<json>` into the item of
an associative list whose key fields have those values, `v:<json>` names an item of a set, and `.`
marks a node that is itself a member when it also has members below it. This module holds that set
type, the encoding, and the two walks ownership needs: which fields an object sets under a schema
(`fields_of`) and what changed between two versions of an object (`compare`).

How a node is walked depends on its schema (`Shape`): a map either merges key by key or is atomic
(one leaf), a list is atomic, a list-map (items identified by key fields) or a set (primitive items
identified by value). `shape_for` is the one place that says where the shapes come from: the stored
CRD's openAPIV3Schema for custom resources, the strategic merge tables of `tfusion.api.merge` for
built-in kinds (merge-keyed lists are list-maps, primitive merge lists are sets, other lists atomic).

Paths are tuples of encoded steps (`("f:spec", "f:replicas")`), so that set algebra is Python's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

# the strategic merge tables are the one record of built-in list strategies (read, never changed here)
from tfusion.api.merge import _KIND_SCHEMAS, _OBJECT_META

__all__ = [
    "FieldSet",
    "FieldsError",
    "Path",
    "Shape",
    "compare",
    "encoded_has",
    "encoded_with",
    "encoded_without",
    "fields_of",
    "fields_v1_of",
    "item_step",
    "item_steps",
    "names_item",
    "path_text",
    "shape_for",
]

Path = tuple[str, ...]


class FieldsError(ValueError):
    """A FieldsV1 document that is not one: names the step at fault."""


# ---------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """What ownership needs to know about one node of an object.

    `fields` are the declared fields of a struct; a key outside them takes `elements` (the value
    schema of a map, undeclared) or, without one, an untyped shape. `declared_default` says whether
    such an untyped key counts as a declared field (built-in kinds, whose structs we do not list in
    full) or as a map entry (custom resources' free-form maps). For lists, `elements` is the item
    shape and `list_type` is "atomic", "map" (items keyed by `keys`) or "set".
    """

    fields: Mapping[str, Shape] = field(default_factory=dict)
    elements: Shape | None = None
    list_type: str = "atomic"
    keys: tuple[str, ...] = ()
    atomic_map: bool = False
    declared_default: bool = False

    def child(self, key: str) -> tuple[Shape, bool]:
        """The shape of the value under `key`, and whether `key` is a declared field."""
        declared = self.fields.get(key)
        if declared is not None:
            return declared, True
        if self.elements is not None:
            return self.elements, False
        return (_BUILTIN_ANY if self.declared_default else _UNTYPED), self.declared_default


_UNTYPED = Shape()
_BUILTIN_ANY = Shape(declared_default=True)
_FROM_MERGE: dict[str, Shape] = {}
_FROM_CRD: dict[int, tuple[dict[str, Any], Shape]] = {}


def shape_for(kind: str, crd_schema: dict[str, Any] | None = None) -> Shape:
    """The root shape of an object: from its CRD's openAPIV3Schema, else from the merge tables.

    This is the one lookup to replace when the full Kubernetes definitions become the source.
    """
    if crd_schema is not None:
        cached = _FROM_CRD.get(id(crd_schema))
        if cached is not None and cached[0] is crd_schema:
            return cached[1]
        root = _from_openapi(crd_schema)
        shape = Shape(
            fields={**root.fields, "metadata": _builtin_shape(_OBJECT_META)},
            elements=root.elements,
            declared_default=root.declared_default,
        )
        if len(_FROM_CRD) > 256:
            _FROM_CRD.clear()
        _FROM_CRD[id(crd_schema)] = (crd_schema, shape)
        return shape
    known = _FROM_MERGE.get(kind)
    if known is None:
        known = _FROM_MERGE[kind] = _builtin_shape(_KIND_SCHEMAS.get(kind) or {})
    return known


def _builtin_shape(schema: Mapping[str, Any]) -> Shape:
    """A shape from a strategic merge table: `schema` maps field names to merge.Field entries."""
    fields: dict[str, Shape] = {}
    for name, spec in schema.items():
        sub = _builtin_shape(spec.sub)
        if spec.merges and spec.merge_key:
            fields[name] = Shape(elements=sub, list_type="map", keys=(spec.merge_key,), declared_default=True)
        elif spec.merges:
            fields[name] = Shape(elements=_BUILTIN_ANY, list_type="set", declared_default=True)
        else:
            # a nested struct merges field by field; an untagged list is atomic
            fields[name] = sub
    return Shape(fields=fields, declared_default=True)


def _from_openapi(node: Any) -> Shape:
    if not isinstance(node, dict):
        return _UNTYPED
    if node.get("type") == "array" or "items" in node:
        items = _from_openapi(node.get("items"))
        list_type = node.get("x-kubernetes-list-type") or "atomic"
        keys = tuple(k for k in node.get("x-kubernetes-list-map-keys") or () if isinstance(k, str))
        if list_type == "map" and not keys:
            list_type = "atomic"
        return Shape(elements=items, list_type=str(list_type), keys=keys)
    properties = node.get("properties")
    fields = {k: _from_openapi(v) for k, v in properties.items()} if isinstance(properties, dict) else {}
    extra = node.get("additionalProperties")
    elements = _from_openapi(extra) if isinstance(extra, dict) else None
    return Shape(fields=fields, elements=elements, atomic_map=node.get("x-kubernetes-map-type") == "atomic")


# ---------------------------------------------------------------------------------------------- steps


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def item_step(item: Any, shape: Shape) -> str | None:
    """The step naming a list item: `k:` for a list-map item, `v:` for a set item; None when the list
    cannot be walked item by item (then it is owned whole)."""
    if shape.list_type == "map":
        if not isinstance(item, dict) or any(k not in item for k in shape.keys):
            return None
        return "k:" + _json({k: item[k] for k in shape.keys})
    if shape.list_type == "set":
        if isinstance(item, dict | list):
            return None
        return "v:" + _json(item)
    return None


def names_item(item: Any, step: str) -> bool:
    """Is `item` the list item a `k:` or `v:` step names?"""
    if step.startswith("k:"):
        wanted = orjson.loads(step[2:])
        return isinstance(item, dict) and all(k in item for k in wanted) and \
            step == "k:" + _json({k: item[k] for k in wanted})
    return step.startswith("v:") and not isinstance(item, dict | list) and step == "v:" + _json(item)


def item_steps(items: list[Any], shape: Shape) -> list[str] | None:
    """Each item's step, or None when the list is owned whole (atomic, or items that do not fit)."""
    if shape.list_type == "atomic":
        return None
    steps: list[str] = []
    for item in items:
        step = item_step(item, shape)
        if step is None:
            return None
        steps.append(step)
    return steps if len(set(steps)) == len(steps) else None


def path_text(path: Path) -> str:
    """A path as kube prints it in conflicts: `.spec.replicas`, `.spec.containers[name="app"].image`."""
    out: list[str] = []
    for step in path:
        kind, rest = step[:2], step[2:]
        if kind == "f:":
            out.append("." + rest)
        elif kind == "k:":
            keys = orjson.loads(rest)
            out.append("[" + ",".join(f"{k}={_json(v)}" for k, v in keys.items()) + "]")
        elif kind == "v:":
            out.append(f"[={rest}]")
        else:
            out.append(f"[{rest}]")
    return "".join(out)


# ---------------------------------------------------------------------------------------------- the set


class FieldSet:
    """An immutable set of field paths with the algebra ownership needs and the FieldsV1 encoding."""

    __slots__ = ("paths",)

    def __init__(self, paths: Iterable[Path] = ()) -> None:
        self.paths: frozenset[Path] = paths if isinstance(paths, frozenset) else frozenset(paths)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldSet) and self.paths == other.paths

    def __hash__(self) -> int:
        return hash(self.paths)

    def __repr__(self) -> str:
        return f"FieldSet({sorted(self.paths)!r})"

    def __len__(self) -> int:
        return len(self.paths)

    def __bool__(self) -> bool:
        return bool(self.paths)

    def __iter__(self) -> Iterator[Path]:
        return iter(self.paths)

    def __contains__(self, path: object) -> bool:
        return path in self.paths

    def union(self, other: FieldSet) -> FieldSet:
        return FieldSet(self.paths | other.paths)

    def difference(self, other: FieldSet) -> FieldSet:
        return FieldSet(self.paths - other.paths)

    def intersection(self, other: FieldSet) -> FieldSet:
        return FieldSet(self.paths & other.paths)

    def prefixes(self) -> frozenset[Path]:
        """Every path that is a member or lies above one: "does anyone own this node or below it"."""
        return frozenset(p[:i] for p in self.paths for i in range(len(p) + 1))

    # ------------------------------------------------------------------------------ FieldsV1
    def encode(self) -> dict[str, Any]:
        """The FieldsV1 document: nested objects keyed by steps, `.` where a member has members below."""
        root: dict[str, Any] = {}
        for path in self.paths:
            node = root
            for step in path:
                node = node.setdefault(step, {})
            node["."] = {}
        return _tidy(root)

    @classmethod
    def decode(cls, document: Any) -> FieldSet:
        """The set a FieldsV1 document describes; FieldsError names a step that is not one."""
        if not isinstance(document, dict):
            raise FieldsError(f"must be an object, got {type(document).__name__}")
        paths: set[Path] = set()
        _decode_into(document, (), paths, 0)
        return cls(paths)


def _tidy(node: dict[str, Any]) -> dict[str, Any]:
    """Turn the build form (every member marked `.`) into FieldsV1: a childless member is `{}`."""
    out: dict[str, Any] = {}
    member = "." in node
    children = sorted(k for k in node if k != ".")
    if member and children:
        out["."] = {}
    for key in children:
        out[key] = _tidy(node[key])
    return out


_STEP_KINDS = ("f:", "k:", "v:", "i:")


def _decode_into(node: dict[str, Any], at: Path, out: set[Path], depth: int) -> None:
    if depth > 100:
        raise FieldsError("nested deeper than 100 levels")
    if not node and at:
        out.add(at)
        return
    for key, child in node.items():
        if key == ".":
            if child != {}:
                raise FieldsError(f"{path_text(at) or '.'}: the '.' member must be an empty object")
            if at:
                out.add(at)
            continue
        if not isinstance(key, str) or key[:2] not in _STEP_KINDS:
            raise FieldsError(f"{path_text(at) or '.'}: {key!r} is not a field step (f:, k:, v:, i: or .)")
        if key[:2] in ("k:", "v:"):
            try:
                value = orjson.loads(key[2:])
            except orjson.JSONDecodeError:
                raise FieldsError(f"{path_text(at) or '.'}: {key!r} does not hold JSON after its prefix") from None
            if key[:2] == "k:" and not isinstance(value, dict):
                raise FieldsError(f"{path_text(at) or '.'}: {key!r} must name key fields as a JSON object")
        if not isinstance(child, dict):
            raise FieldsError(f"{path_text((*at, key))}: must be an object, got {type(child).__name__}")
        _decode_into(child, (*at, key), out, depth + 1)


# ---------------------------------------------------------------------------------------------- encoded edits
# The writes our controllers repeat many times a second change a few fields of objects whose entries
# own dozens: these edit a FieldsV1 document along the changed paths only, copying what they touch,
# instead of decoding and encoding every entry.


def encoded_has(document: Any, path: Path) -> bool:
    """Is `path` a member of the FieldsV1 `document`?"""
    node = document
    for step in path:
        if not isinstance(node, dict):
            return False
        node = node.get(step)
        if node is None:
            return False
    return isinstance(node, dict) and (not node or "." in node)


def encoded_without(document: dict[str, Any], paths: Iterable[Path]) -> dict[str, Any]:
    """`document` less `paths` (a new document; `document` is left alone)."""
    for path in paths:
        if path and encoded_has(document, path):
            document = _drop(document, path, 0) or {}
    return document


def _drop(node: dict[str, Any], path: Path, depth: int) -> dict[str, Any] | None:
    """`node` without the member at path[depth:]; None when nothing is left of a non-member node."""
    step = path[depth]
    child = node[step]
    if depth == len(path) - 1:
        rest = {k: v for k, v in child.items() if k != "."}
        new_child: dict[str, Any] | None = rest or None
    else:
        new_child = _drop(child, path, depth + 1)
        if new_child is not None and set(new_child) == {"."}:
            new_child = {}
    out = {k: v for k, v in node.items() if k != step}
    if new_child is not None:
        out[step] = new_child
    if not out:
        return None
    if set(out) == {"."}:
        return {}
    return out


def encoded_with(document: dict[str, Any], paths: Iterable[Path]) -> dict[str, Any]:
    """`document` plus `paths` (a new document; `document` is left alone)."""
    for path in paths:
        if path and not encoded_has(document, path):
            document = _add(document, path, 0)
    return document


def _add(node: dict[str, Any], path: Path, depth: int) -> dict[str, Any]:
    step = path[depth]
    out = dict(node)
    child = node.get(step)
    if depth == len(path) - 1:
        out[step] = {".": {}, **child} if child else {}
    elif child is None:
        out[step] = _add({}, path, depth + 1)
    else:
        grown = _add(child, path, depth + 1)
        out[step] = grown if child else {".": {}, **grown}  # a member leaf that now has members below
    return out


# ---------------------------------------------------------------------------------------------- walks


def fields_of(value: Any, shape: Shape, at: Path = ()) -> set[Path]:
    """The paths an object (or the subtree at `at`) sets, as kube counts them for an applied object:
    leaves and atomic values, list items, map entries that are not declared fields, and declared
    fields whose value is empty or null; a declared field with members below is not itself one."""
    out: set[Path] = set()
    _collect(value, shape, at, out)
    return out


def _collect(value: Any, shape: Shape, at: Path, out: set[Path]) -> None:
    if isinstance(value, dict):
        if shape.atomic_map:
            out.add(at)
            return
        for key, child in value.items():
            sub, declared = shape.child(key)
            path = (*at, "f:" + key)
            _collect(child, sub, path, out)
            if not declared or child is None or child == {}:
                out.add(path)
    elif isinstance(value, list):
        steps = item_steps(value, shape)
        if steps is None:
            out.add(at)
            return
        item_shape = shape.elements or _UNTYPED
        for step, item in zip(steps, value, strict=True):
            path = (*at, step)
            out.add(path)
            if step[0] == "k":
                _collect(item, item_shape, path, out)
    else:
        out.add(at)


def fields_v1_of(value: Any, shape: Shape) -> dict[str, Any]:
    """`FieldSet(fields_of(value, shape)).encode()` in one walk, without building paths: every create
    records its writer's entry, and objects with a few hundred fields are common. An object's
    `spec` is looked up by its JSON first (`_SpecFields`)."""
    children, _ = _encoded(value, shape, top=True)
    return children


class _SpecFields:
    """The FieldsV1 of recently seen specs, by shape and JSON text. The pods of one template (a
    Deployment's, a Job's) are created with equal specs, up to their pod-index resource (one of
    128), and a pod's spec is most of its fields: its walk was about a twelfth of the embedded API
    server's CPU while it scheduled such pods. An entry holds its shape, so a shape made again
    (a CRD changed) never takes another's answer; answers are copies, so no caller can change one."""

    SIZE = 2048

    def __init__(self) -> None:
        self._known: dict[tuple[int, bytes], tuple[Shape, bytes, bool]] = {}

    def encoded(self, spec: dict[str, Any], shape: Shape) -> tuple[dict[str, Any], bool]:
        try:
            key = (id(shape), orjson.dumps(spec))
        except orjson.JSONEncodeError:  # not JSON orjson writes (an integer past 64 bits): walked, not kept
            return _encoded(spec, shape)
        found = self._known.get(key)
        if found is not None and found[0] is shape:
            below: dict[str, Any] = orjson.loads(found[1])
            return below, found[2]
        below, member = _encoded(spec, shape)
        if len(self._known) >= self.SIZE:
            self._known.clear()  # a burst of distinct specs: start again rather than keep order
        self._known[key] = (shape, orjson.dumps(below), member)
        return below, member


_SPECS = _SpecFields()


def _encoded(value: Any, shape: Shape, *, top: bool = False) -> tuple[dict[str, Any], bool]:
    """The FieldsV1 children of a node, and whether the node is a member by its own value (`top`:
    the node is an object, whose spec `_SPECS` may know)."""
    if isinstance(value, dict):
        if shape.atomic_map:
            return {}, True
        out: dict[str, Any] = {}
        for key, child in value.items():
            if not isinstance(child, dict | list):  # most fields: a scalar, a member leaf whatever its schema
                out["f:" + key] = {}
                continue
            sub, declared = shape.child(key)
            below, member = _SPECS.encoded(child, sub) if top and key == "spec" and isinstance(child, dict) \
                else _encoded(child, sub)
            _put(out, "f:" + key, below, member or not declared or child is None or child == {})
        return out, False
    if isinstance(value, list):
        steps = item_steps(value, shape)
        if steps is None:
            return {}, True
        items: dict[str, Any] = {}
        item_shape = shape.elements or _UNTYPED
        for step, item in zip(steps, value, strict=True):
            below = _encoded(item, item_shape)[0] if step[0] == "k" else {}
            _put(items, step, below, True)
        return items, False
    return {}, True


def _put(out: dict[str, Any], step: str, below: dict[str, Any], member: bool) -> None:
    if member:
        out[step] = {".": {}, **below} if below else {}
    elif below:
        out[step] = below


def _subtree(value: Any, shape: Shape, at: Path, declared: bool) -> set[Path]:
    members = fields_of(value, shape, at)
    if not declared or not isinstance(value, dict) or not value:
        members.add(at)
    return members


@dataclass
class Comparison:
    """What changed between two versions of an object, as sets of paths."""

    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    @property
    def same(self) -> bool:
        return not (self.added or self.modified or self.removed)

    def changed(self) -> set[Path]:
        return self.added | self.modified


def compare(old: Any, new: Any, shape: Shape) -> Comparison:
    """Walk two versions of an object side by side; equal subtrees are skipped in one comparison."""
    result = Comparison()
    _compare(old, new, shape, (), result)
    return result


def _compare(old: Any, new: Any, shape: Shape, at: Path, out: Comparison) -> None:
    if old == new and type(old) is type(new):
        return
    if isinstance(old, dict) and isinstance(new, dict) and not shape.atomic_map:
        for key in old.keys() | new.keys():
            sub, declared = shape.child(key)
            path = (*at, "f:" + key)
            if key not in new:
                out.removed |= _subtree(old[key], sub, path, declared)
            elif key not in old:
                out.added |= _subtree(new[key], sub, path, declared)
            else:
                _compare(old[key], new[key], sub, path, out)
        return
    if isinstance(old, list) and isinstance(new, list):
        old_steps, new_steps = item_steps(old, shape), item_steps(new, shape)
        if old_steps is not None and new_steps is not None:
            item_shape = shape.elements or _UNTYPED
            before = dict(zip(old_steps, old, strict=True))
            after = dict(zip(new_steps, new, strict=True))
            for step in before.keys() | after.keys():
                path = (*at, step)
                if step not in after:
                    out.removed |= _subtree(before[step], item_shape, path, False)
                elif step not in before:
                    out.added |= _subtree(after[step], item_shape, path, False)
                elif step[0] == "k":
                    _compare(before[step], after[step], item_shape, path, out)
            return
    if isinstance(old, dict | list) or isinstance(new, dict | list):
        # a change of shape: the old members go, the new ones come, the node itself is modified
        if at:
            out.modified.add(at)
        out.removed |= fields_of(old, shape, at) - {at}
        out.added |= fields_of(new, shape, at) - {at}
        return
    out.modified.add(at)
