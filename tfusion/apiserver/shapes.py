"""kube-apiserver's 400 for a body whose known fields have the wrong JSON type.

The shapes themselves, and the walk that finds the first mismatch, are in `api/shapes.py` (the
controller's admission webhook checks pods with them too); this module turns a mismatch into the
answer kube's typed decoding gives, and re-exports the request-body shapes the handlers name.
"""

from __future__ import annotations

from typing import Any

from tfusion.api.shapes import (
    BINDING,
    DEFAULT_SHAPE,
    EVICTION,
    KIND_SHAPES,
    SCALE,
    TOKEN_REQUEST,
    TOKEN_REVIEW,
    Obj,
    mismatch,
    not_an_object,
)
from tfusion.apiserver import errors
from tfusion.apiserver.errors import ApiError

__all__ = ["BINDING", "EVICTION", "SCALE", "TOKEN_REQUEST", "TOKEN_REVIEW", "cannot_handle", "check", "check_body"]


def check(storage_key: str, kind: str, version: str, obj: Any) -> None:
    """Raise 400 (as kube's typed decoding does) when a known field has the wrong JSON type."""
    check_body(KIND_SHAPES.get(storage_key, DEFAULT_SHAPE), kind, version, obj)


def check_body(shape: Obj, kind: str, version: str, body: Any) -> None:
    problem = mismatch(shape, body) if isinstance(body, dict) else not_an_object(body)
    if problem:
        raise cannot_handle(kind, version, problem)


def cannot_handle(kind: str, version: str, problem: str) -> ApiError:
    return errors.bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: {problem}')
