"""The three PATCH flavours kube-apiserver accepts, over plain JSON values.

- `merge_patch`: JSON merge patch (RFC 7386), `application/merge-patch+json`.
- `json_patch`: JSON patch (RFC 6902), `application/json-patch+json`.
- `strategic_merge_patch`: Kubernetes strategic merge patch,
  `application/strategic-merge-patch+json`, for the built-in kinds this server serves. It lives in
  `api/merge.py`, which the controller shares; this module re-exports it so the API server's
  handlers find all three flavours in one place.

Every function returns a new value and leaves its inputs untouched. Errors raise `PatchError`
(a `ValueError`) with a message naming the operation and path at fault; callers answer 422/400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from tfusion.api.merge import STRATEGIC_MERGE_KINDS, PatchError, strategic_merge_patch
from tfusion.api.merge import clone as _clone

__all__ = [
    "STRATEGIC_MERGE_KINDS",
    "PatchError",
    "PatchTooLarge",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]


class PatchTooLarge(PatchError):
    """Applying the patch would make the document larger than the caller's limit (`size` bytes)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


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


def merge_patch(target: Any, patch: Any, *, owned: bool = False) -> Any:
    """Apply an RFC 7386 merge patch: objects merge recursively, null deletes, all else replaces.

    With `owned`, `target` is the caller's private copy and is merged in place (no copy at all)."""
    if not isinstance(patch, dict):
        return _clone(patch)
    if not isinstance(target, dict):
        return _merge_into({}, patch)
    # at most one deep copy of the target, then merged in place: copying again at every level of the
    # patch made a patch of metadata.annotations copy the whole object three times
    return _merge_into(target if owned else _clone(target), patch)


def _merge_into(result: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Merge `patch` into `result`, which the caller owns (no part of it is shared)."""
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _merge_into(current if isinstance(current, dict) else {}, value)
        else:
            result[key] = _clone(value)
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
    if "~" not in pointer:  # nearly every path: nothing escaped
        return tokens
    if _BAD_ESCAPE.search(pointer):
        raise _OpFailed(f"{what} {pointer!r} has an invalid escape: '~' must be followed by 0 or 1")
    return [t.replace("~1", "/").replace("~0", "~") if "~" in t else t for t in tokens]


#: RFC 6901: "~" escapes only "~0" and "~1"
_BAD_ESCAPE = re.compile("~(?![01])")


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


def _value_of(op: Mapping[str, Any], ops_owned: bool) -> Any:
    if "value" not in op:
        raise _OpFailed("missing required member 'value'")
    return op["value"] if ops_owned else _clone(op["value"])


def _apply_op(doc: Any, op: Mapping[str, Any], ops_owned: bool) -> Any:
    name = op["op"]
    tokens = _parse_pointer(op["path"], "path")
    if name == "add":
        return _add(doc, tokens, _value_of(op, ops_owned))
    if name == "remove":
        return _remove(doc, tokens)[0]
    if name == "replace":
        return _replace(doc, tokens, _value_of(op, ops_owned))
    if name == "test":
        expected = _value_of(op, True)  # compared, never stored
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


def json_patch(target: Any, ops: Any, *, max_bytes: int | None = None, owned: bool = False,
               ops_owned: bool = False) -> Any:
    """Apply an RFC 6902 JSON patch (a list of operations) and return the patched copy (the patched
    `target` itself with `owned`: the caller's private copy, which a failing op leaves half patched).
    With `ops_owned` (the ops were just decoded and nobody else holds them) their values go into
    the document as they are, not copied.

    With `max_bytes`, the document's JSON size is kept under it while the ops run: `copy` and `add`
    can double a document per op, so checking only the result would let a short patch build
    gigabytes first. Raises PatchTooLarge at the first op that crosses the limit.
    """
    if not isinstance(ops, list):
        raise PatchError(f"a JSON patch must be a list of operations, got {type(ops).__name__}")
    doc = target if owned else _clone(target)
    budget = _SizeBudget(doc, max_bytes) if max_bytes is not None else None
    for index, op in enumerate(ops):
        if not isinstance(op, dict):
            raise PatchError(f"op {index}: must be an object, got {type(op).__name__}")
        name = op.get("op")
        if name not in _JSON_PATCH_OPS:
            raise PatchError(f"{_label(index, op)}: unknown op {name!r}; allowed: {', '.join(_JSON_PATCH_OPS)}")
        if "path" not in op:
            raise PatchError(f"{_label(index, op)}: missing required member 'path'")
        try:
            doc = _apply_op(doc, op, ops_owned)
            if budget is not None and name in ("add", "copy", "replace", "move"):
                budget.grew(doc, op, index)
        except _OpFailed as exc:
            raise PatchError(f"{_label(index, op)}: {exc}") from None
        except RecursionError:
            raise PatchError(f"{_label(index, op)}: the document becomes too deeply nested") from None
    return doc


def _label(index: int, op: Mapping[str, Any]) -> str:
    """How an error names the op (written only for an error: patches of many ops are common)."""
    return f"op {index} ({op.get('op')} {op.get('path')})"


class _SizeBudget:
    """An upper estimate of a document's JSON size, made exact whenever it crosses the limit."""

    def __init__(self, doc: Any, limit: int) -> None:
        self.limit = limit
        self.estimate = _json_size(doc, lambda: "the target")

    def grew(self, doc: Any, op: Mapping[str, Any], index: int) -> None:
        def label() -> str:
            return _label(index, op)

        if op["op"] == "copy":
            added = _json_size(_walk(doc, _parse_pointer(op["from"], "from")), label)
        elif op["op"] == "move":
            added = 0
        else:
            added = _json_size(op.get("value"), label)
        self.estimate += added
        if self.estimate > self.limit:
            self.estimate = _json_size(doc, label)
            if self.estimate > self.limit:
                raise PatchTooLarge(f"{label()}: the object would grow to {self.estimate} bytes", self.estimate)


def _json_size(value: Any, label: Callable[[], str]) -> int:
    """The JSON size of `value`; `label` names what failed, should it not encode."""
    try:
        return len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        raise PatchError(f"{label()}: the document becomes too deeply nested") from None
