"""Bounded decoding of request bodies: how large, how deep and how expanded a document may be.

Every request body is untrusted. Without bounds a 437-byte YAML alias bomb expands to hundreds of
megabytes, a 5,000-digit integer or a recursive alias crashes a handler, and a deep document
overruns orjson's encoder (which refuses more than 254 levels) or Python's recursion in the patch
and validation code. The numbers follow kube-apiserver where it has one:

- request bodies: at most 3 MiB (kube-apiserver's limit for a write);
- stored objects: at most 1.5 MiB once encoded (etcd's default request size, which is what makes
  kube refuse larger objects);
- nesting: at most 100 levels of objects and arrays. kube-apiserver allows 10,000, which our
  encoder (254) and recursive walks cannot; no Kubernetes object needs more than ~20 (a Pod's
  deepest fields are about 12 levels down), so 100 leaves room for custom resources;
- integers: they must fit in 64 bits (a Go int64/uint64), as kube's decoders require;
- YAML: only the JSON-compatible core (maps, sequences, strings, numbers, booleans, null);
  `!!binary`, `!!set`, `!!python/...` and other tags are refused, as are recursive aliases and
  aliases whose expansion would exceed the stored-object limit.

Decoding a large body is CPU work that would hold the event loop; `decode_body` is synchronous so
that app.py can run it in a worker thread above `THREAD_THRESHOLD`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import yaml

from tfusion.apiserver import errors
from tfusion.apiserver.errors import ApiError

MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_OBJECT_BYTES = 1536 * 1024
MAX_DEPTH = 100
#: bodies above this are decoded (and encoded) in a worker thread, off the event loop
THREAD_THRESHOLD = 256 * 1024
_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")}
_MERGE_TAG = f"{_CORE}merge"


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


def too_deep(where: str) -> ApiError:
    return errors.bad_request(f"{where}: the document is nested more than {MAX_DEPTH} levels deep")


# ------------------------------------------------------------------------------------------- GC
_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a large document is decoded.

    Decoding allocates hundreds of thousands of objects, which triggers full collections that walk
    the whole heap with the GIL held: measured, they stalled the event loop for 300-500 ms while a
    3 MiB body was decoded in a worker thread (13 ms without them). Decoded JSON holds no
    reference cycles, so postponing collection frees nothing late; the collector resumes when the
    last concurrent decode ends.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


# ------------------------------------------------------------------------------------------- JSON
def decode_json(body: bytes, what: str = "JSON") -> Any:
    """orjson, then the depth and integer checks orjson does not make."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise too_deep(f"error decoding {what}") from None
        raise errors.bad_request(f"error decoding {what}: {exc}") from None
    check_value(value, f"error decoding {what}")
    return value


def check_value(value: Any, where: str) -> None:
    """Refuse a decoded value nested deeper than MAX_DEPTH or holding an integer beyond 64 bits."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            _check_scalar(node, where)
            continue
        if depth > MAX_DEPTH:
            raise too_deep(where)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | int | float))


def _check_scalar(value: Any, where: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
        raise errors.bad_request(f"{where}: integer {_short(value)} does not fit in 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise errors.bad_request(f"{where}: number {value} is not finite")


def _short(value: int) -> str:
    if value.bit_length() < 200:
        return str(value)
    return f"of about {int(value.bit_length() * 0.30103)} digits"


def encoded_size(obj: Any) -> int:
    """Length of the JSON encoding; an object too deep to encode counts as too large."""
    try:
        return len(orjson.dumps(obj))
    except orjson.JSONEncodeError:
        return MAX_OBJECT_BYTES + 1


# ------------------------------------------------------------------------------------------- YAML
class _YamlRefused(Exception):
    """A node the bounded YAML reader will not turn into a value; the message says why."""


def decode_yaml(body: bytes) -> Any:
    """One YAML document as JSON-compatible values, with aliases expanded under a size budget."""
    try:
        node = yaml.compose(body, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise errors.bad_request(f"error decoding YAML: {exc}") from None
    except RecursionError:
        raise too_deep("error decoding YAML") from None
    if node is None:
        return None
    reader = _YamlReader()
    try:
        reader.measure(node, 1, set())
        return reader.build(node)
    except _YamlRefused as exc:
        raise errors.bad_request(f"error decoding YAML: {exc}") from None
    finally:
        _dismantle(node)


def _dismantle(root: yaml.Node) -> None:
    """Free a node graph piece by piece. Dropped at once, a graph of a few MiB is freed in one C
    call that holds the GIL (and so the event loop) for ~80 ms; this loop lets other threads in."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
            node.value = []
        elif isinstance(node, yaml.MappingNode):
            stack.extend(child for pair in node.value for child in pair)
            node.value = []


class _YamlReader:
    """Builds values from a composed node graph. Aliases are shared nodes in that graph, so the
    expanded size is measured first (memoised per node, cycles detected) and nothing is built
    unless it fits."""

    def __init__(self) -> None:
        #: node id -> (expanded size, levels of nesting below and including it)
        self.measured: dict[int, tuple[int, int]] = {}
        self.total = 0
        #: whether an alias has been expanded (then an oversized document is an alias bomb: 400)
        self.aliased = False

    def measure(self, node: yaml.Node, depth: int, path: set[int]) -> tuple[int, int]:
        key = id(node)
        if key in path:
            raise _YamlRefused(f"line {node.start_mark.line + 1}: an alias refers to the node that contains it")
        known = self.measured.get(key)
        if known is not None:
            self.aliased = True
            self._count(known[0], node)
            self._check_depth(depth + known[1] - 1, node)
            return known
        if isinstance(node, yaml.ScalarNode):
            size, height = len(node.value) + 2, 0
            self._count(size, node)
        else:
            self._check_depth(depth, node)
            path.add(key)
            size, height = 2, 1
            children = node.value if isinstance(node, yaml.SequenceNode) else [c for kv in node.value for c in kv]
            for child in children:
                child_size, child_height = self.measure(child, depth + 1, path)
                size += child_size + 1
                height = max(height, child_height + 1)
            path.discard(key)
        self.measured[key] = (size, height)
        return size, height

    @staticmethod
    def _check_depth(depth: int, node: yaml.Node) -> None:
        if depth > MAX_DEPTH:
            raise _YamlRefused(f"line {node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")

    def _count(self, size: int, node: yaml.Node) -> None:
        self.total += size
        if self.total > MAX_OBJECT_BYTES:
            if not self.aliased:
                raise object_too_large(self.total)
            raise _YamlRefused(
                f"line {node.start_mark.line + 1}: the document expands (through its aliases) to more than "
                f"{MAX_OBJECT_BYTES} bytes, the largest object that can be stored"
            )

    def build(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != f"{_CORE}seq":
                raise _unsupported(node)
            return [self.build(item) for item in node.value]
        if isinstance(node, yaml.MappingNode):
            if node.tag != f"{_CORE}map":
                raise _unsupported(node)
            return self._mapping(node)
        raise _unsupported(node)

    def _mapping(self, node: yaml.MappingNode) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.update(self._merge_source(value_node))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise _YamlRefused(f"line {key_node.start_mark.line + 1}: a mapping key must be a scalar")
            _scalar(key_node)  # the same tag rules apply to keys
            result[key_node.value] = self.build(value_node)
        return {**merged, **result}

    def _merge_source(self, node: yaml.Node) -> dict[str, Any]:
        """`<<: *base` or `<<: [*a, *b]`: earlier sources win, keys of the mapping itself win over all."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for source in reversed(sources):
            value = self.build(source)
            if not isinstance(value, dict):
                raise _YamlRefused(f"line {source.start_mark.line + 1}: a merge key (<<) needs a mapping")
            merged.update(value)
        return merged


def _unsupported(node: yaml.Node) -> _YamlRefused:
    return _YamlRefused(
        f"line {node.start_mark.line + 1}: the tag {node.tag} is not supported; only JSON-compatible "
        "values (maps, sequences, strings, numbers, booleans, null) are accepted"
    )


_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _scalar(node: yaml.ScalarNode) -> Any:
    tag, text = node.tag, node.value
    if tag not in _SCALAR_TAGS:
        raise _unsupported(node)
    if tag in (f"{_CORE}str", f"{_CORE}timestamp"):
        return text  # timestamps stay strings, as kube's YAML-to-JSON conversion leaves them
    if tag == f"{_CORE}null":
        return None
    if tag == f"{_CORE}bool":
        return _BOOLS.get(text.lower(), False)
    if tag == f"{_CORE}int":
        return _integer(node)
    return _float(node)


def _integer(node: yaml.ScalarNode) -> int:
    text = node.value.replace("_", "")
    digits = text.lstrip("+-")
    if len(digits) > 40:
        raise _YamlRefused(f"line {node.start_mark.line + 1}: integer of {len(digits)} digits does not fit in 64 bits")
    sign = -1 if text.startswith("-") else 1
    try:
        if digits.startswith("0x"):
            value = int(digits[2:], 16)
        elif digits.startswith("0o"):
            value = int(digits[2:], 8)
        elif digits.startswith("0b"):
            value = int(digits[2:], 2)
        elif ":" in digits:  # YAML 1.1 sexagesimal
            value = 0
            for part in digits.split(":"):
                value = value * 60 + int(part)
        elif len(digits) > 1 and digits.startswith("0"):
            value = int(digits, 8)
        else:
            value = int(digits)
    except ValueError:
        raise _YamlRefused(f"line {node.start_mark.line + 1}: {node.value!r} is not an integer") from None
    value *= sign
    if not _INT64_MIN <= value <= _UINT64_MAX:
        raise _YamlRefused(f"line {node.start_mark.line + 1}: integer {value} does not fit in 64 bits")
    return value


def _float(node: yaml.ScalarNode) -> float:
    text = node.value.replace("_", "").lower()
    if text in (".inf", "+.inf", "-.inf", ".nan"):
        raise _YamlRefused(f"line {node.start_mark.line + 1}: {node.value} is not a JSON number")
    try:
        value = float(text)
    except ValueError:
        raise _YamlRefused(f"line {node.start_mark.line + 1}: {node.value!r} is not a number") from None
    if not math.isfinite(value):
        raise _YamlRefused(f"line {node.start_mark.line + 1}: {node.value} is not a finite number")
    return value
