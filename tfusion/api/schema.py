"""Structural OpenAPI v3 schemas applied to custom resources the way kube-apiserver applies them.

Why it exists: the embedded API server must accept and reject custom resources exactly like a real
cluster, for any CRD a user applies (not only ours), and our own models are checked against the
CRDs generated from them. Three steps, in kube-apiserver's order:

1. `prune(schema, obj)` drops fields the schema does not know (unless
   `x-kubernetes-preserve-unknown-fields`); `unknown_fields()` lists them without dropping, for
   `fieldValidation=Strict|Warn`.
2. `apply_defaults(schema, obj)` fills `default`s of absent fields (objects are only descended when
   present) after removing `null`s of non-nullable fields, as structural defaulting does.
3. `validate(schema, obj)` returns `FieldError`s whose `field`, `reason` and `message` read like
   kube-apiserver's (`spec.count: Invalid value: "string": spec.count in body must be of type
   integer: "string"`).

`apiVersion`, `kind` and `metadata` at the root are never pruned; metadata is only type-checked
loosely (name and format rules belong to the API server's object-meta validation). CEL rules
(`x-kubernetes-validations`) are evaluated by tfusion.apiserver.cel, not here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, NamedTuple

import orjson

from tfusion.api.jsontypes import JsonObject

__all__ = [
    "FieldError", "apply_defaults", "format_errors", "iter_schema_paths", "prune", "subschema",
    "unknown_fields", "validate",
]

Schema = dict[str, Any]

_ROOT_KEYS: Final = frozenset({"apiVersion", "kind", "metadata"})
_FORMAT_RANGES: Final = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


class FieldError(NamedTuple):
    """One problem with one field, worded like kube-apiserver's field.Error."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def format_errors(errors: list[FieldError]) -> str:
    """All errors as kube-apiserver joins them in a 422 message: `[a: ..., b: ...]` or a single one."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"


# --- validation ---------------------------------------------------------------------------------


def validate(schema: Schema, obj: Any, valid_old: Any = None) -> list[FieldError]:
    """Every violation of `schema` by `obj` (which should be pruned and defaulted first).

    `valid_old`: an earlier version of the object known to satisfy `schema` (the API server passes
    the stored object when it was validated against this very schema). A property or list item the
    same as there cannot fail (whether a value satisfies its schema depends on nothing else), so it
    is not walked again: a status write re-checks the status, not the spec."""
    errors: list[FieldError] = []
    _Validator(errors).check(schema, obj, "", root=True, old=valid_old)
    return errors


def _same(value: Any, old: Any) -> bool:
    """`value` is exactly `old` as JSON (Python's == alone takes True for 1 and 1.0 for 1, which a
    schema's types tell apart)."""
    if type(value) is not type(old):
        return False
    if not isinstance(value, dict | list):
        return bool(value == old)
    try:
        return bool(value == old) and orjson.dumps(value) == orjson.dumps(old)
    except orjson.JSONEncodeError:  # an integer past 64 bits: walked like any changed value
        return False


class _Validator:
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors

    def add(self, path: str, reason: str, message: str) -> None:
        self.errors.append(FieldError(path, reason, message))

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.add(path, "FieldValueInvalid", f"Invalid value: {_show(value)}: {detail}")

    def check(self, schema: Schema, obj: Any, path: str, *, root: bool = False, old: Any = None) -> None:
        """`old`: the same place in a version known to be valid (None: none), see `validate`."""
        if obj is None:
            if not schema.get("nullable"):
                self._type_mismatch(schema, obj, path)
            return
        if not self._check_type(schema, obj, path):
            return
        self._check_values(schema, obj, path)
        for keyword in ("allOf", "anyOf", "oneOf", "not"):
            if keyword in schema:
                self._check_combinator(keyword, schema[keyword], obj, path)
        if isinstance(obj, dict):
            self._check_object(schema, obj, path, root=root, old=old if isinstance(old, dict) else None)
        elif isinstance(obj, list):
            self._check_array(schema, obj, path, old=old if isinstance(old, list) else None)

    # types

    def _check_type(self, schema: Schema, obj: Any, path: str) -> bool:
        if schema.get("x-kubernetes-int-or-string"):
            if _is_int(obj) or isinstance(obj, str):
                return True
            self.add(path, "FieldValueTypeInvalid", f"Invalid value: {_show(_json_type(obj))}: "
                     f"{_body(path)} in body must be of type integer,string: {_show(_json_type(obj))}")
            return False
        expected = schema.get("type")
        if expected is None or _has_type(obj, expected):
            return True
        self._type_mismatch(schema, obj, path)
        return False

    def _type_mismatch(self, schema: Schema, obj: Any, path: str) -> None:
        expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema.get("type", "")
        actual = _json_type(obj)
        self.add(path, "FieldValueTypeInvalid",
                 f"Invalid value: {_show(actual)}: {_body(path)} in body must be of type {expected}: "
                 f"{_show(actual)}")

    # scalar rules

    def _check_values(self, schema: Schema, obj: Any, path: str) -> None:
        if "enum" in schema and not any(_json_equal(obj, v) for v in schema["enum"]):
            supported = ", ".join(_show(v) for v in schema["enum"])
            self.add(path, "FieldValueNotSupported",
                     f"Unsupported value: {_show(obj)}: supported values: {supported}")
        if isinstance(obj, str):
            self._check_string(schema, obj, path)
        elif _is_number(obj):
            self._check_number(schema, obj, path)

    def _check_string(self, schema: Schema, obj: str, path: str) -> None:
        body = _body(path)
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            self.add(path, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(obj) < schema["minLength"]:
            self.invalid(path, obj, f"{body} in body should be at least {schema['minLength']} chars long")
        pattern = schema.get("pattern")
        if pattern is not None and not _compiled(pattern).search(obj):
            self.invalid(path, obj, f"{body} in body should match '{pattern}'")
        if schema.get("format") == "date-time" and not _is_date_time(obj):
            self.invalid(path, obj, f"{body} in body must be of type date-time: {_show(obj)}")

    def _check_number(self, schema: Schema, obj: float, path: str) -> None:
        body = _body(path)
        fmt = schema.get("format")
        if fmt in _FORMAT_RANGES and _is_int(obj):
            low, high = _FORMAT_RANGES[fmt]
            if not low <= obj <= high:
                self.invalid(path, obj, f"{body} in body must be of type {fmt}: {_show(str(obj))}")
        if "minimum" in schema:
            low = schema["minimum"]
            if schema.get("exclusiveMinimum") and obj <= low:
                self.invalid(path, obj, f"{body} in body should be greater than {_num(low)}")
            elif obj < low:
                self.invalid(path, obj, f"{body} in body should be greater than or equal to {_num(low)}")
        if "maximum" in schema:
            high = schema["maximum"]
            if schema.get("exclusiveMaximum") and obj >= high:
                self.invalid(path, obj, f"{body} in body should be less than {_num(high)}")
            elif obj > high:
                self.invalid(path, obj, f"{body} in body should be less than or equal to {_num(high)}")
        if "multipleOf" in schema and obj % schema["multipleOf"] != 0:
            self.invalid(path, obj, f"{body} in body should be a multiple of {_num(schema['multipleOf'])}")

    # combinators (value validations only, as structural schemas allow)

    def _check_combinator(self, keyword: str, value: Any, obj: Any, path: str) -> None:
        if keyword == "allOf":
            for sub in value:
                self.check(sub, obj, path)
            return
        if keyword == "not":
            if not _sub_errors(value, obj, path):
                self.invalid(path, obj, f"{_body(path)} in body must not validate the schema (not)")
            return
        passing = sum(1 for sub in value if not _sub_errors(sub, obj, path))
        if keyword == "anyOf" and passing == 0:
            self.invalid(path, obj, f"{_body(path)} in body must validate at least one schema (anyOf)")
        elif keyword == "oneOf" and passing != 1:
            self.invalid(path, obj, f"{_body(path)} in body must validate one and only one schema (oneOf)")

    # containers

    def _check_object(self, schema: Schema, obj: JsonObject, path: str, *, root: bool,
                      old: JsonObject | None = None) -> None:
        properties: dict[str, Schema] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in obj:
                self.add(_join(path, name), "FieldValueRequired", "Required value")
        if "maxProperties" in schema and len(obj) > schema["maxProperties"]:
            self.add(path, "FieldValueTooMany",
                     f"Too many: {len(obj)}: must have at most {schema['maxProperties']} items")
        if "minProperties" in schema and len(obj) < schema["minProperties"]:
            self.invalid(path, obj,
                         f"{_body(path)} in body should have at least {schema['minProperties']} properties")
        if schema.get("x-kubernetes-embedded-resource"):
            self._check_embedded(obj, path)
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            was = old.get(key) if old is not None else None
            if was is not None and _same(value, was):
                continue
            child = _join(path, key)
            if root and key in _ROOT_KEYS:
                self._check_root_field(key, value, child)
            elif key in properties:
                self.check(properties[key], value, child, old=was)
            elif isinstance(extra, dict):
                self.check(extra, value, child, old=was)

    def _check_embedded(self, obj: JsonObject, path: str) -> None:
        for key in ("apiVersion", "kind"):
            if not obj.get(key):
                self.add(_join(path, key), "FieldValueRequired", "Required value: must not be empty")
        if "metadata" in obj:
            self._check_root_field("metadata", obj["metadata"], _join(path, "metadata"))

    def _check_root_field(self, key: str, value: Any, path: str) -> None:
        if key != "metadata":
            self.check({"type": "string"}, value, path)
            return
        self.check(_METADATA_SCHEMA, value, path)

    def _check_array(self, schema: Schema, obj: list[Any], path: str, *, old: list[Any] | None = None) -> None:
        if "maxItems" in schema and len(obj) > schema["maxItems"]:
            self.add(path, "FieldValueTooMany",
                     f"Too many: {len(obj)}: must have at most {schema['maxItems']} items")
        if "minItems" in schema and len(obj) < schema["minItems"]:
            self.invalid(path, obj, f"{_body(path)} in body should have at least {schema['minItems']} items")
        if schema.get("uniqueItems") or schema.get("x-kubernetes-list-type") == "set":
            seen: set[bytes] = set()
            for i, item in enumerate(obj):
                key = orjson.dumps(item, option=orjson.OPT_SORT_KEYS, default=str)
                if key in seen:
                    self.add(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {_show(item)}")
                seen.add(key)
        items = schema.get("items")
        if isinstance(items, dict):
            olds = old or ()
            for i, item in enumerate(obj):
                was = olds[i] if i < len(olds) else None
                if was is not None and _same(item, was):
                    continue
                self.check(items, item, f"{path}[{i}]", old=was)


_STRING_MAP: Final[Schema] = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA_SCHEMA: Final[Schema] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "generateName": {"type": "string"}, "namespace": {"type": "string"},
        "labels": _STRING_MAP, "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
    },
}


def _sub_errors(schema: Schema, obj: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    _Validator(errors).check(schema, obj, path)
    return errors


# --- defaulting ---------------------------------------------------------------------------------


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Fill defaults in place, the way structural defaulting does, and return `obj`.

    A property's `default` is set (deep-copied) when the property is absent or null-and-not-nullable;
    a null that is not nullable and has no default is removed. Defaults are applied inside objects
    that are present, list items and map values; never through anyOf/allOf/oneOf/not.
    """
    _default(schema, obj)
    return obj


def _default(schema: Schema, obj: Any) -> None:
    if isinstance(obj, dict):
        _default_object(schema, obj)
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(obj):
                if item is None and "default" in items and not items.get("nullable"):
                    obj[i] = copy.deepcopy(items["default"])
                else:
                    _default(items, item)


def _default_object(schema: Schema, obj: JsonObject) -> None:
    properties: dict[str, Schema] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key in list(obj):
        sub = properties.get(key, extra if isinstance(extra, dict) else None)
        if sub is None:
            continue
        if obj[key] is None and not sub.get("nullable"):
            if "default" not in sub:
                del obj[key]
                continue
            obj[key] = copy.deepcopy(sub["default"])
        _default(sub, obj[key])
    for name, sub in properties.items():
        if name not in obj and "default" in sub:
            obj[name] = copy.deepcopy(sub["default"])
            _default(sub, obj[name])


# --- pruning ------------------------------------------------------------------------------------


def prune(schema: Schema, obj: Any) -> Any:
    """Drop, in place, every field `schema` does not specify, and return `obj`.

    Fields under `x-kubernetes-preserve-unknown-fields: true` are kept (their known properties are
    still pruned below them); `apiVersion`, `kind` and `metadata` at the root and in embedded
    resources are kept.
    """
    _prune(schema, obj, "", root=True, found=None)
    return obj


def unknown_fields(schema: Schema, obj: Any) -> list[str]:
    """Paths of the fields `prune` would drop (for strict field validation), without changing `obj`."""
    found: list[str] = []
    _prune(schema, obj, "", root=True, found=found)
    return found


def _prune(schema: Schema, obj: Any, path: str, *, root: bool, found: list[str] | None) -> None:
    if isinstance(obj, dict):
        _prune_object(schema, obj, path, root=root, found=found)
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(obj):
                _prune(items, item, f"{path}[{i}]", root=False, found=found)


def _prune_object(schema: Schema, obj: JsonObject, path: str, *, root: bool,
                  found: list[str] | None) -> None:
    properties: dict[str, Schema] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
    keep_meta = root or bool(schema.get("x-kubernetes-embedded-resource"))
    for key in list(obj):
        child = _join(path, key)
        if keep_meta and key in _ROOT_KEYS:
            continue
        sub = properties.get(key)
        if sub is None and isinstance(extra, dict):
            sub = extra
        if sub is not None:
            _prune(sub, obj[key], child, root=False, found=found)
        elif not keep_unknown:
            if found is None:
                del obj[key]
            else:
                found.append(child)


# --- helpers ------------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _body(path: str) -> str:
    return path or "body"


def _is_int(obj: Any) -> bool:
    return isinstance(obj, int) and not isinstance(obj, bool)


def _is_number(obj: Any) -> bool:
    return isinstance(obj, int | float) and not isinstance(obj, bool)


_TYPE_CHECKS: Final[dict[str, Callable[[Any], bool]]] = {
    "object": lambda o: isinstance(o, dict),
    "array": lambda o: isinstance(o, list),
    "string": lambda o: isinstance(o, str),
    "integer": lambda o: _is_int(o) or (isinstance(o, float) and o.is_integer()),
    "number": _is_number,
    "boolean": lambda o: isinstance(o, bool),
}


def _has_type(obj: Any, expected: str) -> bool:
    check = _TYPE_CHECKS.get(expected)
    return True if check is None else check(obj)


def _json_type(obj: Any) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, int):
        return "integer"
    if isinstance(obj, float):
        return "number"
    if isinstance(obj, str):
        return "string"
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, dict):
        return "object"
    return type(obj).__name__


def _json_equal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _show(value: Any) -> str:
    """A value as Go's %q / %v print it in field errors: strings quoted, the rest as JSON."""
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _num(value)
    if value is None:
        return "null"
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _num(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_DATE_TIME_RE: Final = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?$")


def _is_date_time(value: str) -> bool:
    """RFC 3339 date-time, loosely (strfmt also accepts a missing zone and a space separator)."""
    if not _DATE_TIME_RE.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


def iter_schema_paths(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every (path, sub-schema) below `schema`; arrays appear as `path[*]`, maps as `path.*`."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from iter_schema_paths(sub, _join(path, name))
    if isinstance(schema.get("items"), dict):
        yield from iter_schema_paths(schema["items"], f"{path}[*]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from iter_schema_paths(schema["additionalProperties"], _join(path, "*"))


_PATH_TOKEN: Final = re.compile(r"\[(?P<index>[^\]]*)\]|(?P<key>(?:\\.|[^.\[\\])+)")


def subschema(schema: Schema, path: str) -> Schema | None:
    """The schema of the field at `path`, or None when the schema does not allow that field.

    `path` is a field path (`spec.gpuPools[0].name`) or a printer-column JSONPath
    (`.spec.items[*].name`, `.status.used["requests.tflops"]`, `.metadata.labels.app\\.kubernetes\\.io/name`).
    Below free-form objects (`x-kubernetes-preserve-unknown-fields`, or an object without properties)
    every path exists and the result is `{}`.
    """
    node: Schema = schema
    for token in _PATH_TOKEN.finditer(path):
        index, key = token["index"], token["key"]
        if index is not None and not (index[:1] in "\"'" and len(index) >= 2):
            child = node.get("items") if isinstance(node.get("items"), dict) else _map_values(node)
        else:
            name = index[1:-1] if index is not None else key.replace("\\.", ".")
            child = node.get("properties", {}).get(name)
            if child is None:
                child = _map_values(node)
        if child is None:
            return {} if _free_form(node) else None
        node = child
    return node


def _map_values(node: Schema) -> Schema | None:
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _free_form(node: Schema) -> bool:
    if node.get("x-kubernetes-preserve-unknown-fields") or node.get("additionalProperties") is True:
        return True
    return node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node
