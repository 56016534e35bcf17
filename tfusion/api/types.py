"""The tensor-fusion.ai/v1 API in one import: the models of the 12 kinds, `decode` and `encode`.

Why it exists: every part of tfusion (controller, hypervisor, API server, tests) reads and writes
these objects; this module is the one place that turns manifests into typed models and back.

`decode(manifest)` picks the model by `kind`, treats `null`s and defaults the way kube-apiserver
does (via the generated CRD schema), and raises `ManifestError` naming the bad field Kubernetes
style (`spec.gpuPools[0].name`), its value and what is allowed. `encode(model)` gives the JSON-ready
dict (quantities in canonical form, zero values left out, `apiVersion`/`kind` always present).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import msgspec

from tfusion.api.crds import openapi_schema_view
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.api.kinds import (
    cluster,
    common,
    gpu,
    meta,
    node,
    pool,
    provider,
    provisioning,
    quota,
    scheduling,
    workload,
)
from tfusion.api.kinds.base import API_VERSION, GROUP, VERSION, Model, Quantity, dec_hook, enc_hook
from tfusion.api.kinds.cluster import *  # noqa: F403
from tfusion.api.kinds.common import *  # noqa: F403
from tfusion.api.kinds.gpu import *  # noqa: F403
from tfusion.api.kinds.meta import *  # noqa: F403
from tfusion.api.kinds.node import *  # noqa: F403
from tfusion.api.kinds.pool import *  # noqa: F403
from tfusion.api.kinds.provider import *  # noqa: F403
from tfusion.api.kinds.provisioning import *  # noqa: F403
from tfusion.api.kinds.quota import *  # noqa: F403
from tfusion.api.kinds.registry import KINDS, KINDS_BY_PLURAL, KindInfo, PrinterColumn
from tfusion.api.kinds.scheduling import *  # noqa: F403
from tfusion.api.kinds.workload import *  # noqa: F403
from tfusion.api.schema import FieldError, apply_defaults, subschema, validate

__all__ = [
    "API_VERSION", "GROUP", "KINDS", "KINDS_BY_PLURAL", "VERSION", "FieldError", "KindInfo", "ManifestError",
    "Model",
    "PrinterColumn", "Quantity", "dec_hook", "decode", "decode_as", "enc_hook", "encode", "to_json",
]
__all__ += cluster.__all__
__all__ += common.__all__
__all__ += gpu.__all__
__all__ += meta.__all__
__all__ += node.__all__
__all__ += pool.__all__
__all__ += provider.__all__
__all__ += provisioning.__all__
__all__ += quota.__all__
__all__ += scheduling.__all__
__all__ += workload.__all__

M = TypeVar("M", bound=Model)

_MSGSPEC_ERROR: Final = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING_FIELD: Final = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_BAD_ENUM: Final = re.compile(r"^Invalid enum value (?P<value>.*)$")


class ManifestError(ValueError):
    """A manifest that does not fit the API: which object, which field, what is wrong."""

    def __init__(self, field: str, message: str, *, reason: str = "FieldValueInvalid", kind: str = "",
                 name: str = "", errors: list[FieldError] | None = None) -> None:
        #: every problem found (the first one is `field`/`message`)
        self.errors = errors if errors else [FieldError(field, reason, message)]
        self.field = field
        self.message = message
        self.reason = reason
        self.kind = kind
        self.name = name
        where = f'{kind} "{name}": ' if kind and name else f"{kind}: " if kind else ""
        super().__init__(f"{where}{field}: {message}" if field else f"{where}{message}")


def decode(manifest: JsonMapping) -> Model:
    """The model of a tensor-fusion.ai/v1 manifest, chosen by its `kind`."""
    if not isinstance(manifest, Mapping):
        raise ManifestError("", f"expected an object, got {type(manifest).__name__}")
    api_version = manifest.get("apiVersion")
    if api_version != API_VERSION:
        raise ManifestError(
            "apiVersion", f'Unsupported value: {_quote(api_version)}: supported values: "{API_VERSION}"',
            reason="FieldValueNotSupported", kind=str(manifest.get("kind", "")))
    kind = manifest.get("kind")
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None:
        supported = ", ".join(f'"{k}"' for k in KINDS)
        raise ManifestError("kind", f"Unsupported value: {_quote(kind)}: supported values: {supported}",
                            reason="FieldValueNotSupported")
    return decode_as(info.model, manifest)


def decode_as(model: type[M], manifest: JsonMapping) -> M:
    """`manifest` as `model` (one of the 12 kinds), without looking at its apiVersion/kind."""
    schema = openapi_schema_view(model.KIND)
    data = apply_defaults(schema, copy.deepcopy(dict(manifest)))
    try:
        return msgspec.convert(data, model, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        # the schema's errors are worded like kube-apiserver's and name map keys; the model's own
        # rules (not expressible in the schema) fall back to msgspec's message
        kind, name = model.KIND, _name_of(manifest)
        errors = validate(schema, data)
        if errors:
            first = errors[0]
            raise ManifestError(first.field, first.message, reason=first.reason, kind=kind, name=name,
                                errors=errors) from None
        raise _manifest_error(str(exc), schema, data, kind, name) from None


def encode(obj: Model) -> JsonObject:
    """A JSON-ready dict: camelCase keys, canonical quantities, zero values omitted."""
    data = msgspec.to_builtins(obj, enc_hook=enc_hook)
    assert isinstance(data, dict)
    return data


def to_json(obj: Model) -> bytes:
    """`encode(obj)` as JSON bytes, without the intermediate dict."""
    return msgspec.json.encode(obj, enc_hook=enc_hook)


def _name_of(manifest: JsonMapping) -> str:
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _manifest_error(text: str, schema: JsonObject, data: Any, kind: str, name: str) -> ManifestError:
    match = _MSGSPEC_ERROR.match(text)
    assert match is not None  # the pattern matches any text
    message, path = match["message"], _k8s_path(match["path"] or "")
    missing = _MISSING_FIELD.match(message)
    if missing:
        field = f"{path}.{missing['name']}" if path else missing["name"]
        return ManifestError(field, "Required value", reason="FieldValueRequired", kind=kind, name=name)
    bad_enum = _BAD_ENUM.match(message)
    sub = subschema(schema, path)
    if bad_enum and sub is not None and "enum" in sub:
        supported = ", ".join(f'"{v}"' for v in sub["enum"])
        value = bad_enum["value"].strip("'")
        return ManifestError(path, f'Unsupported value: "{value}": supported values: {supported}',
                             reason="FieldValueNotSupported", kind=kind, name=name)
    message = message.replace(" | null`", "`")
    value = _value_at(data, match["path"] or "")
    if value is not _MISSING:
        message = f"Invalid value: {_quote(value)}: {message}"
    type_error = "Expected " in message and ", got `" in message
    reason = "FieldValueTypeInvalid" if type_error else "FieldValueInvalid"
    return ManifestError(path, message, reason=reason, kind=kind, name=name)


_MISSING: Final = object()
_PATH_STEP: Final = re.compile(r"\.([^.\[]+)|\[(\d+)\]|(\[\.\.\.\])")


def _value_at(data: Any, msgspec_path: str) -> Any:
    """The scalar at a msgspec path, or _MISSING (map keys are not in msgspec paths)."""
    node = data
    for step in _PATH_STEP.finditer(msgspec_path):
        key, index, unknown = step.groups()
        if unknown is not None:
            return _MISSING
        if key is not None and isinstance(node, dict) and key in node:
            node = node[key]
        elif index is not None and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return _MISSING
    return _MISSING if isinstance(node, dict | list) else node


def _k8s_path(msgspec_path: str) -> str:
    """msgspec's `.spec.gpuPools[0].name` (after `$`) as Kubernetes' `spec.gpuPools[0].name`."""
    return msgspec_path[1:] if msgspec_path.startswith(".") else msgspec_path


def _quote(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)
