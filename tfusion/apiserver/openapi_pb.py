"""The Swagger 2.0 document (/openapi/v2) in the protobuf form kubectl asks for.

kubectl downloads /openapi/v2 with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
whenever it validates a manifest whose kind /openapi/v3 does not describe (a kind this server does
not serve, for one) and parses the answer as gnostic's `openapi.v2.Document` message without looking
at its content type. A JSON answer there fails with "proto: cannot parse invalid wire-format data";
with this encoding kubectl finds the kind missing, skips client-side validation, and reports what
kube-apiserver would ("no matches for kind").

Only what the JSON document holds is encoded: swagger, info, and the definitions' schemas (type,
description, format, $ref, required, properties, items, allOf, additionalProperties and the `x-`
vendor extensions, whose values gnostic keeps as YAML text; JSON is YAML). Field numbers are those
of gnostic's OpenAPIv2.proto.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

#: the form without "@" (Go's media-type parser refuses that character in the form kubectl asks for)
CONTENT_TYPE = b"application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

_SCHEMA_STRINGS = {"$ref": 1, "format": 2, "title": 3, "description": 4, "discriminator": 26}


def wants_protobuf(accept: str) -> bool:
    """True when the Accept header lists the protobuf document before (or without) JSON."""
    for media in accept.split(","):
        kind = media.split(";")[0].strip()
        if kind.endswith("+protobuf"):
            return True
        if kind in ("application/json", "*/*", "application/*"):
            return False
    return False


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings and messages alike)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: object) -> bytes:
    return _field(number, str(value).encode()) if value not in (None, "") else b""


def _named(number: int, name: str, value: bytes) -> bytes:
    return _field(number, _text(1, name) + _field(2, value))


def _any_yaml(value: object) -> bytes:
    return _field(2, orjson.dumps(value))


def _schemas(number: int, schemas: Mapping[str, Any]) -> bytes:
    """A Properties or Definitions message: named schemas, in order."""
    return b"".join(
        _named(number, name, schema(value)) for name, value in schemas.items() if isinstance(value, Mapping)
    )


def schema(obj: Mapping[str, Any]) -> bytes:
    """One JSON schema object as an `openapi.v2.Schema` message."""
    out = [_text(n, obj.get(key)) for key, n in _SCHEMA_STRINGS.items()]
    out += [_text(19, name) for name in obj.get("required", ()) if isinstance(name, str)]
    extra = obj.get("additionalProperties")
    if isinstance(extra, Mapping):
        out.append(_field(21, _field(1, schema(extra))))
    elif isinstance(extra, bool):
        out.append(_field(21, _varint(2 << 3) + _varint(int(extra))))
    kind = obj.get("type")
    kinds = [kind] if isinstance(kind, str) else [k for k in kind or () if isinstance(k, str)]
    if kinds:
        out.append(_field(22, b"".join(_text(1, k) for k in kinds)))
    items = obj.get("items")
    if isinstance(items, Mapping):
        items = [items]
    if isinstance(items, list):
        out.append(_field(23, b"".join(_field(1, schema(i)) for i in items if isinstance(i, Mapping))))
    out += [_field(24, schema(s)) for s in obj.get("allOf", ()) if isinstance(s, Mapping)]
    properties = obj.get("properties")
    if isinstance(properties, Mapping):
        out.append(_field(25, _schemas(1, properties)))
    out += [_named(31, key, _any_yaml(value)) for key, value in obj.items() if key.startswith("x-")]
    return b"".join(out)


def document(doc: Mapping[str, Any]) -> bytes:
    """The whole Swagger document as an `openapi.v2.Document` message (paths are left out)."""
    info = doc.get("info")
    out = [_text(1, doc.get("swagger"))]
    if isinstance(info, Mapping):
        out.append(_field(2, _text(1, info.get("title")) + _text(2, info.get("version"))))
    definitions = doc.get("definitions")
    if isinstance(definitions, Mapping):
        out.append(_field(9, _schemas(1, definitions)))
    return b"".join(out)
