"""CustomResourceDefinitions of tensor-fusion.ai/v1, generated from the models.

Why it exists: the models in tfusion.api.kinds are the one description of the API; the CRDs a
cluster (or the embedded API server) enforces must say exactly the same thing, so they are derived
from the models instead of written by hand. `deploy/base/crds/` is this module's output (`tfusion crds
--out deploy/base/crds`), and a test keeps the two identical.

Mapping (what controller-gen emits for the Go original): Struct -> object with sorted properties
and `required`; Literal -> string enum; Quantity -> int-or-string with the quantity pattern;
RawExtension -> object with `x-kubernetes-preserve-unknown-fields`; dict -> additionalProperties;
datetime -> date-time string; msgspec.Meta bounds -> minimum/maximum/minLength/maxLength/pattern.
A field's Python default becomes the schema `default` unless it is a Go zero value. A field's
attribute docstring (the string literal below it) becomes its `description`, which is what
`kubectl explain` prints; a Struct's `SCHEMA_EXTRA` is merged into its object schema.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Literal, get_args, get_origin, get_type_hints

import msgspec
import msgspec.inspect as mi
import yaml

from tfusion.api.jsontypes import JsonObject
from tfusion.api.kinds.base import DEFAULT_KEY, FORMAT_RANGES, GROUP, REQUIRED_KEY, VERSION, Model, Quantity
from tfusion.api.kinds.registry import KINDS, KindInfo, PrinterColumn

__all__ = [
    "QUANTITY_PATTERN", "all_crds", "crd_for", "crd_name", "crds_yaml", "field_docs", "file_name", "openapi_schema",
    "openapi_schema_view", "write_crds",
]

#: the pattern controller-gen puts on every resource.Quantity
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")

_QUANTITY_SCHEMA: Final[JsonObject] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY_PATTERN,
    "x-kubernetes-int-or-string": True,
}
_API_VERSION_DOC: Final = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values.")
_KIND_DOC: Final = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this "
    "from the endpoint the client submits requests to. Cannot be updated. In CamelCase.")
_METADATA_DOC: Final = (
    "Standard Kubernetes object metadata: name, namespace (for namespaced kinds), labels, annotations, "
    "owner references and finalizers.")
_ZERO_VALUES: Final = ("", 0, False)


def crd_name(info: KindInfo) -> str:
    return f"{info.plural}.{GROUP}"


def file_name(info: KindInfo) -> str:
    return f"{GROUP}_{info.plural}.yaml"


@cache
def _openapi_schema(kind: str) -> JsonObject:
    info = _info(kind)
    fields = {f.encode_name: f for f in _struct_fields(info.model)}
    properties: JsonObject = {
        "apiVersion": {"description": _API_VERSION_DOC, "type": "string"},
        "kind": {"description": _KIND_DOC, "type": "string"},
        "metadata": {"description": _METADATA_DOC, "type": "object"},
    }
    hints = get_type_hints(info.model, include_extras=True)
    docs = field_docs(info.model)
    for name in ("spec", "status"):
        if name in fields:
            properties[name] = _field_schema(fields[name], hints[name], docs)
    schema: JsonObject = {"type": "object", "properties": properties}
    required = sorted(name for name, f in fields.items() if _is_required(f))
    if required:
        schema["required"] = [*required]
    if info.description:
        schema = {"description": info.description, **schema}
    return schema


def openapi_schema_view(kind: str) -> JsonObject:
    """The openAPIV3Schema of `kind`, shared and cached: read it, never change it."""
    return _openapi_schema(kind)


def openapi_schema(kind: str) -> JsonObject:
    """The openAPIV3Schema of `kind` (a fresh copy the caller may change)."""
    return copy.deepcopy(_openapi_schema(kind))


def crd_for(kind: str) -> JsonObject:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    info = _info(kind)
    names: JsonObject = {"kind": info.kind, "listKind": info.list_kind, "plural": info.plural}
    if info.short_names:
        names["shortNames"] = [*info.short_names]
    names["singular"] = info.singular
    version: JsonObject = {"name": VERSION}
    if info.printer_columns:
        version["additionalPrinterColumns"] = [_printer_column(c) for c in info.printer_columns]
    version["schema"] = {"openAPIV3Schema": openapi_schema(kind)}
    version["served"] = True
    version["storage"] = True
    if info.has_status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name(info)},
        "spec": {"group": GROUP, "names": names, "scope": info.scope, "versions": [version]},
    }


def all_crds() -> list[JsonObject]:
    """Every CRD, in the fixed order of the kind registry."""
    return [crd_for(kind) for kind in KINDS]


def crds_yaml() -> str:
    """All CRDs as one YAML stream (what `tfusion crds` prints)."""
    return "".join(_dump(crd) for crd in all_crds())


def write_crds(out_dir: str | Path) -> list[Path]:
    """Write `tensor-fusion.ai_<plural>.yaml` per kind into `out_dir`; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, info in KINDS.items():
        path = out / file_name(info)
        path.write_text(_dump(crd_for(kind)), encoding="utf-8")
        paths.append(path)
    return paths


# --- model walking -------------------------------------------------------------------------------


def _info(kind: str) -> KindInfo:
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}") from None


def _struct_fields(model: type[msgspec.Struct]) -> tuple[mi.Field, ...]:
    info = mi.type_info(model)
    assert isinstance(info, mi.StructType)
    return info.fields


def _field_extra(tp: mi.Type) -> JsonObject:
    if isinstance(tp, mi.Metadata):
        return dict(tp.extra or {})
    if isinstance(tp, mi.UnionType):
        merged: JsonObject = {}
        for member in tp.types:
            merged.update(_field_extra(member))
        return merged
    return {}


def _literal_orders(hint: Any) -> list[tuple[Any, ...]]:
    """The value tuples of every Literal inside a type hint, in declaration order."""
    if get_origin(hint) is Literal:
        return [get_args(hint)]
    return [order for arg in get_args(hint) for order in _literal_orders(arg)]


@cache
def field_docs(model: type[Model]) -> dict[str, str]:
    """Python field name -> attribute docstring, for the fields `model` itself declares."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):  # no source (frozen install): the schema simply has no descriptions
        return {}
    [class_def] = ast.parse(source).body
    assert isinstance(class_def, ast.ClassDef)
    docs: dict[str, str] = {}
    body = class_def.body
    for statement, following in pairwise(body):  # a docstring follows its field
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = _unwrap(following.value.value)
    return docs


def _unwrap(docstring: str) -> str:
    """A docstring as schema text: wrapped lines joined, blank-line paragraphs kept apart."""
    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _field_schema(field: mi.Field, hint: Any, docs: dict[str, str]) -> JsonObject:
    # msgspec.inspect sorts Literal values; enums keep the order they are declared in
    schema = _type_schema(field.type, _literal_orders(hint))
    if field.name in docs:
        schema["description"] = docs[field.name]
    extra = _field_extra(field.type)
    if DEFAULT_KEY in extra:
        schema["default"] = extra[DEFAULT_KEY]
    elif _is_schema_default(field.default):
        schema["default"] = field.default
    return dict(sorted(schema.items()))


def _is_schema_default(value: object) -> bool:
    if value is msgspec.NODEFAULT or value is None or not isinstance(value, str | int | bool):
        return False
    return not any(type(value) is type(zero) and value == zero for zero in _ZERO_VALUES)


def _is_required(field: mi.Field) -> bool:
    return field.required or bool(_field_extra(field.type).get(REQUIRED_KEY))


def _struct_schema(tp: mi.StructType) -> JsonObject:
    hints = get_type_hints(tp.cls, include_extras=True)
    docs = field_docs(tp.cls)
    properties = {f.encode_name: _field_schema(f, hints[f.name], docs) for f in tp.fields}
    schema: JsonObject = {}
    if properties:
        schema["properties"] = dict(sorted(properties.items()))
    required = sorted(f.encode_name for f in tp.fields if _is_required(f))
    if required:
        schema["required"] = [*required]
    schema["type"] = "object"
    schema.update(getattr(tp.cls, "SCHEMA_EXTRA", {}))
    return dict(sorted(schema.items()))


def _type_schema(tp: mi.Type, orders: list[tuple[Any, ...]]) -> JsonObject:
    if isinstance(tp, mi.Metadata):
        return _metadata_schema(tp, orders)
    if isinstance(tp, mi.UnionType):
        members = [t for t in tp.types if not isinstance(t, mi.NoneType)]
        if len(members) != 1:
            raise TypeError(f"unions other than `T | None` have no structural schema: {tp!r}")
        return _type_schema(members[0], orders)
    if isinstance(tp, mi.StructType):
        return _struct_schema(tp)
    if isinstance(tp, mi.CustomType) and tp.cls is Quantity:
        return copy.deepcopy(_QUANTITY_SCHEMA)
    if isinstance(tp, mi.ListType):
        schema: JsonObject = {"items": _type_schema(tp.item_type, orders), "type": "array"}
        _add_bounds(schema, maxItems=tp.max_length, minItems=tp.min_length)
        return schema
    if isinstance(tp, mi.DictType):
        if isinstance(tp.value_type, mi.AnyType):
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"additionalProperties": _type_schema(tp.value_type, orders), "type": "object"}
    return _scalar_schema(tp, orders)


def _scalar_schema(tp: mi.Type, orders: list[tuple[Any, ...]]) -> JsonObject:
    if isinstance(tp, mi.LiteralType):
        declared = next((order for order in orders if set(order) == set(tp.values)), tp.values)
        return {"enum": list(declared), "type": "string"}
    if isinstance(tp, mi.StrType):
        schema: JsonObject = {"type": "string"}
        _add_bounds(schema, maxLength=tp.max_length, minLength=tp.min_length, pattern=tp.pattern)
        return schema
    if isinstance(tp, mi.BoolType):
        return {"type": "boolean"}
    if isinstance(tp, mi.IntType):
        schema = {"type": "integer"}
        _add_bounds(schema, maximum=tp.le, minimum=tp.ge)
        _add_exclusive(schema, tp.gt, tp.lt)
        return schema
    if isinstance(tp, mi.FloatType):
        return {"type": "number"}
    if isinstance(tp, mi.DateTimeType):
        return {"format": "date-time", "type": "string"}
    if isinstance(tp, mi.AnyType):
        return {"x-kubernetes-preserve-unknown-fields": True}
    raise TypeError(f"no CRD schema for {tp!r}")


def _metadata_schema(tp: mi.Metadata, orders: list[tuple[Any, ...]]) -> JsonObject:
    schema = _type_schema(tp.type, orders)
    fmt = (tp.extra or {}).get("format")
    if fmt is not None:
        schema["format"] = fmt
        low, high = FORMAT_RANGES.get(fmt, (None, None))
        if schema.get("minimum") == low:
            del schema["minimum"]
        if schema.get("maximum") == high:
            del schema["maximum"]
    schema.update(tp.extra_json_schema or {})
    if schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" in schema:
        del schema["additionalProperties"]
    return dict(sorted(schema.items()))


def _add_bounds(schema: JsonObject, **bounds: int | str | None) -> None:
    schema.update({key: value for key, value in bounds.items() if value is not None})


def _add_exclusive(schema: JsonObject, gt: int | None, lt: int | None) -> None:
    if gt is not None:
        schema.update(minimum=gt, exclusiveMinimum=True)
    if lt is not None:
        schema.update(maximum=lt, exclusiveMaximum=True)


def _printer_column(column: PrinterColumn) -> JsonObject:
    entry: JsonObject = {"jsonPath": column.json_path, "name": column.name, "type": column.type}
    if column.priority:
        entry["priority"] = column.priority
    return entry


class _Dumper(yaml.SafeDumper):
    """Block style, no aliases, multi-line strings as literal blocks: stable, diff-friendly YAML."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(doc: JsonObject) -> str:
    return "---\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                               allow_unicode=True, width=100)
