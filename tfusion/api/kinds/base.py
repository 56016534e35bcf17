"""Building blocks shared by every tensor-fusion.ai/v1 model: the Struct base and field types.

Why it exists: the models are the single source of truth for the wire format AND for the CRD
schemas (crds.py walks them), so the few conventions both sides rely on live here:

* `Model` is a msgspec Struct with keyword-only fields that omits fields equal to their default.
  A field's Python default is its Kubernetes default (so a decoded object reads like what the API
  server stores), optional scalars default to the zero value ("" / 0 / False, as Go's omitempty),
  optional objects and pointers default to None. `Annotated[T, REQUIRED]` marks a field the CRD
  lists as required although the model has a default for it.
* Every field carries a description for `kubectl explain`: a string literal right below the field
  (an attribute docstring, the convention Sphinx and IDEs read); crds.py reads them with `ast`.
  `SCHEMA_EXTRA` on a Struct adds schema keys to the object itself (`x-kubernetes-map-type`).
* `Int32`/`Int64`/`UInt32` carry the OpenAPI `format`; `RawExtension` is an arbitrary object
  (`x-kubernetes-preserve-unknown-fields`); `Quantity` fields are Kubernetes int-or-string.
* `dec_hook`/`enc_hook` turn wire quantities into `Quantity` objects and back to canonical
  strings, exactly as the Go controller does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Final, TypeAlias

import msgspec

from tfusion.api.quantity import Quantity, QuantityError

__all__ = [
    "API_VERSION", "ATOMIC_LIST", "ATOMIC_MAP", "DEFAULT_EMPTY", "DEFAULT_FALSE", "DEFAULT_ZERO", "GROUP", "I32",
    "REQUIRED", "VERSION",
    "Int32", "Int64", "Model", "Percent", "Quantity", "RawExtension", "UInt32", "constant", "dec_hook",
    "enc_hook",
]

GROUP: Final = "tensor-fusion.ai"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

#: key in `msgspec.Meta.extra` marking a schema-required field that has a Python default
REQUIRED_KEY: Final = "k8s_required"
#: key in `msgspec.Meta.extra` carrying a schema default that equals the Go zero value
DEFAULT_KEY: Final = "k8s_default"


class Model(msgspec.Struct, omit_defaults=True, kw_only=True, rename="camel"):
    """Base of every model: camelCase on the wire, zero/default values omitted when encoding."""

    #: the kind name, on the 12 top-level models only
    KIND: ClassVar[str] = ""
    #: extra schema keys of this object (e.g. `x-kubernetes-map-type: atomic`), merged by crds.py
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {}


def constant(value: str) -> Callable[[], str]:
    """A default factory for `apiVersion` and `kind`: msgspec never omits factory-made strings."""
    return lambda: value


#: the value range of each integer `format`; crds.py leaves bounds equal to these out of the schema
FORMAT_RANGES: Final[dict[str, tuple[int, int]]] = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


#: `extra` for a bounded 32-bit integer: Annotated[int, msgspec.Meta(ge=.., le=.., extra=I32)]
I32: Final[dict[str, Any]] = {"format": "int32"}
#: marks a schema-required field that has a Python default: Annotated[T, REQUIRED]
REQUIRED: Final = msgspec.Meta(extra={REQUIRED_KEY: True})
#: schema defaults equal to Go zero values (left out of the schema unless marked)
DEFAULT_ZERO: Final = msgspec.Meta(extra={DEFAULT_KEY: 0})
DEFAULT_FALSE: Final = msgspec.Meta(extra={DEFAULT_KEY: False})
DEFAULT_EMPTY: Final = msgspec.Meta(extra={DEFAULT_KEY: ""})

Int32: TypeAlias = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1, extra={"format": "int32"})]
Int64: TypeAlias = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1, extra={"format": "int64"})]
#: Go's uint32: controller-gen gives it `format: int32` and no bounds, so the CRD (and we) accept
#: what the original's CRD accepts; a negative value is the writer's mistake, not a schema error
UInt32: TypeAlias = Int32
Percent: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=100, extra={"format": "int32"})]
#: a list the API server replaces as a whole on merge (`x-kubernetes-list-type: atomic`)
ATOMIC_LIST: Final = msgspec.Meta(extra_json_schema={"x-kubernetes-list-type": "atomic"})
#: an object the API server replaces as a whole on merge (for `SCHEMA_EXTRA`)
ATOMIC_MAP: Final[dict[str, Any]] = {"x-kubernetes-map-type": "atomic"}
RawExtension: TypeAlias = Annotated[
    dict[str, Any], msgspec.Meta(extra_json_schema={"x-kubernetes-preserve-unknown-fields": True})]


def dec_hook(tp: type, obj: object) -> object:
    """Decode the custom field types: quantities are an integer or a string, never a float."""
    if tp is Quantity:
        if isinstance(obj, bool) or not isinstance(obj, str | int):
            raise TypeError(f"Expected a quantity (integer or string), got `{_json_type(obj)}`")
        try:
            return Quantity.parse(obj)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"no decoder for {tp!r}")


def enc_hook(obj: object) -> object:
    """Encode quantities in their canonical string form, as Go's resource.Quantity does."""
    if isinstance(obj, Quantity):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _json_type(obj: object) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, float):
        return "float"
    if isinstance(obj, dict):
        return "object"
    if isinstance(obj, list):
        return "array"
    return type(obj).__name__
