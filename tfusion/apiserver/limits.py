"""The API server's bounds on request bodies: how large a body and a stored object may be, and the
kube Status errors for a document that is too large, too deep or too expanded.

Every request body is untrusted. Decoding is `tfusion.api.documents`, the one bounded JSON/YAML
reader the controller and the hypervisor use too (depth, alias expansion measured before anything
is built, self-referencing aliases, JSON-compatible tags only, 64-bit integers, finite numbers, the
garbage collector paused meanwhile); this module picks the API server's numbers and turns its
`DocumentError` into a 400 BadRequest, or a 413 RequestEntityTooLarge for a plain YAML document
larger than a stored object may be. The numbers follow kube-apiserver where it has one:

- request bodies: at most 3 MiB (kube-apiserver's limit for a write);
- stored objects: at most 1.5 MiB once encoded (etcd's default request size, which is what makes
  kube refuse larger objects); a YAML body's aliases may expand to no more than that;
- nesting: at most 100 levels of objects and arrays. kube-apiserver allows 10,000, which our
  encoder (orjson refuses more than 254) and recursive walks cannot; no Kubernetes object needs
  more than ~20 (a Pod's deepest fields are about 12 levels down), so 100 leaves room for custom
  resources;
- integers: they must fit in 64 bits (a Go int64/uint64), as kube's decoders require.

Decoding a large body is CPU work that would hold the event loop; the decoders are synchronous so
that app.py can run them in a worker thread above `THREAD_THRESHOLD`.
"""

from __future__ import annotations

from typing import Any

import orjson

from tfusion.api import documents
from tfusion.apiserver import errors
from tfusion.apiserver.errors import ApiError

MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_OBJECT_BYTES = 1536 * 1024
MAX_DEPTH = documents.MAX_DEPTH
THREAD_THRESHOLD = documents.THREAD_THRESHOLD
#: held around the decoding of a large body; the same pause (one count) as every other decoder's
gc_paused = documents.collector_paused


def body_too_large(size: int | None = None) -> ApiError:
    """kube-apiserver's answer to an oversized request body."""
    got = f" (got {size} bytes)" if size is not None else ""
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY_BYTES}{got}")


def object_too_large(size: int) -> ApiError:
    """What etcd's request limit means for a client: this object cannot be stored."""
    return ApiError(
        413,
        "RequestEntityTooLarge",
        f"Request entity too large: the object is {size} bytes once encoded; the limit for a stored "
        f"object is {MAX_OBJECT_BYTES} bytes (etcdserver: request is too large)",
    )


def encoded_size(obj: Any) -> int:
    """Length of the JSON encoding; an object too deep to encode counts as too large."""
    try:
        return len(orjson.dumps(obj))
    except orjson.JSONEncodeError:
        return MAX_OBJECT_BYTES + 1


def decode_json(body: bytes, what: str = "JSON") -> Any:
    """One JSON document (`what` names it in errors: "JSON", "patch"), within the bounds, or a 400."""
    try:
        return documents.load_json(body, max_depth=MAX_DEPTH)
    except documents.DocumentError as exc:
        raise _refusal(exc, f"error decoding {what}") from None


def decode_yaml(body: bytes) -> Any:
    """One YAML document as JSON-compatible values, its aliases expanding to at most a stored object."""
    try:
        return documents.load_yaml(body, max_bytes=MAX_OBJECT_BYTES, max_depth=MAX_DEPTH)
    except documents.DocumentError as exc:
        raise _refusal(exc, "error decoding YAML") from None


def check_value(value: Any, where: str) -> None:
    """Refuse a value decoded some other way (protobuf) or built by a patch that is nested deeper than
    MAX_DEPTH or holds an integer beyond 64 bits or a number that is not finite."""
    try:
        documents.check_value(value, MAX_DEPTH)
    except documents.DocumentError as exc:
        raise _refusal(exc, where) from None


def _refusal(exc: documents.DocumentError, where: str) -> ApiError:
    if isinstance(exc, documents.DocumentTooLarge):
        return object_too_large(exc.size)
    return errors.bad_request(f"{where}: {exc.problem}")
