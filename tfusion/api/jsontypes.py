"""The type of JSON data: what a body, a patch or a generated schema is before it is encoded.

Why it exists: `dict[str, Any]` says nothing and lets any value through unchecked. A builder of a
JSON document (a CRD schema, a status patch, a wire record) returns `JsonObject`, so mypy checks
that every value it puts in is JSON; a reader of a Kubernetes object uses the views in
`api/accessors.py` instead. The alias is recursive (mypy understands it); msgspec, orjson and
kr8s take these values as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

#: any JSON value as Python holds it after decoding (or before encoding)
JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
#: a JSON object being built (mutable)
JsonObject: TypeAlias = "dict[str, JsonValue]"
#: any JSON value only read, at every depth (read-only containers are covariant: a list[str] is one)
JsonReadValue: TypeAlias = "bool | int | float | str | Sequence[JsonReadValue] | Mapping[str, JsonReadValue] | None"
#: a JSON object only read (covariant in its values, so a dict[str, str] or a JsonObject is one)
JsonMapping: TypeAlias = "Mapping[str, JsonReadValue]"


def json_copy(value: object) -> JsonValue:
    """A deep copy of decoded JSON typed as JSON (a value read through a view is `object` or
    `JsonMapping`; a builder that keeps it in the document it writes needs it as `JsonValue`).
    Raises TypeError on anything JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_copy(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [json_copy(v) for v in value]
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_object(value: Mapping[str, object]) -> JsonObject:
    """A deep copy of a decoded JSON object, typed as one being built."""
    return {k: json_copy(v) for k, v in value.items()}
