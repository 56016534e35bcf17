"""Bounded decoding of untrusted JSON and YAML documents (request bodies of the controller and the
hypervisor), free of any HTTP framework: errors are `DocumentError`, which each edge turns into its
own 400.

Why bounds: PyYAML's `safe_load` expands aliases without limit (a 437-byte alias bomb becomes
hundreds of megabytes), builds recursive structures from a self-referencing alias, accepts
`!!binary` and `!!set`, and turns a 5,000-digit integer into a ValueError deep in its constructor;
deep JSON overruns Python's recursion (`json.loads`) or orjson's 1,024 levels. Here:

- nesting is at most `max_depth` levels of objects and arrays (100 by default: a Pod's deepest
  field is about 12 levels down);
- a YAML document may expand, through its aliases, to at most `max_bytes` (counted as JSON-ish
  text: each scalar's length plus a little per element), measured on the composed node graph
  before anything is built; a cycle (an alias inside the node it names) is refused;
- only the JSON-compatible core of YAML is accepted: maps, sequences, strings, integers, floats,
  booleans, null (timestamps stay strings, as kube's YAML-to-JSON conversion leaves them), and the
  merge key `<<`; every other tag is refused by name;
- integers must fit in 64 bits (signed or unsigned), floats must be finite.

libyaml (PyYAML's C parser) is required: it parses a few MiB in well under a second and refuses
more than 1,000 levels of nesting itself, so composing never recurses without bound.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import yaml

MAX_DEPTH = 100
_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1
#: an integer literal longer than this cannot fit in 64 bits in any notation (binary needs 64 + "0b")
_MAX_INT_CHARS = 80

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null", "timestamp"))
_SEQ, _MAP, _MERGE = f"{_CORE}seq", f"{_CORE}map", f"{_CORE}merge"
_LOADER = yaml.CSafeLoader
#: nodes visited between two chances for other threads to run (a visit takes about a microsecond)
_YIELD_EVERY = 256
_CONSTRUCT = yaml.constructor.SafeConstructor()


class DocumentError(ValueError):
    """A document that is not readable within the bounds; the message says what and where."""


# --- JSON -------------------------------------------------------------------------------------------

def load_json(body: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON document, at most `max_depth` levels deep, numbers within 64 bits / finite."""
    try:
        with collector_paused():
            value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise DocumentError(_json_message(exc, max_depth)[0]) from None
    check_depth(value, max_depth)
    return value


def _json_message(exc: orjson.JSONDecodeError, max_depth: int) -> tuple[str, bool]:
    """What was wrong, and whether it was a well-formed document out of bounds (not a syntax error)."""
    text = str(exc)
    if "depth limit" in text:
        return f"invalid JSON: nested more than {max_depth} levels deep", True
    if "infinity" in text:
        return f"invalid JSON: a number is too large ({text})", True
    return f"invalid JSON: {text}", False


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a decoded value whose objects and arrays nest deeper than `max_depth` (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise DocumentError(f"the document is nested more than {max_depth} levels deep")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


# --- YAML -------------------------------------------------------------------------------------------

def load_yaml(body: bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """One YAML document as JSON-compatible values; aliases may expand to at most `max_bytes`."""
    return _yaml_value(body, max_bytes, max_depth, syntax_prefix="")


def _yaml_value(body: bytes, max_bytes: int, max_depth: int, *, syntax_prefix: str) -> Any:
    text = _utf8(body)  # libyaml would guess UTF-16 from a byte-order mark; JSON and kube speak UTF-8
    with collector_paused():
        try:
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.YAMLError as exc:
            raise DocumentError(f"{syntax_prefix}invalid YAML: {_one_line(exc)}") from None
        if node is None:
            return None
        builder = _Builder(max_bytes, max_depth)
        builder.measure(node, 1, set())
        value = builder.build(node)
        del node, builder  # freed by reference counting while the collector still sleeps
    return value


_pause_lock = threading.Lock()
_pauses = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off while a document is parsed.

    Composing a few MiB of YAML allocates hundreds of thousands of node and mark objects; that
    triggers full collections, each of which holds the GIL for 100 ms or more in a process with a
    large heap (measured: 80-140 ms in `--role=all`), stalling the event loop even though the
    parse runs in a worker thread. The node graph has no cycles (a cyclic alias is refused), so
    reference counting frees it; the collector is switched back on when the last parse ends.
    `tfusion.web.decode_body` holds it around the whole decoding of a large body (checks too)."""
    global _pauses, _collector_was_enabled
    with _pause_lock:
        if _pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _collector_was_enabled:
                gc.enable()


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"the document is not UTF-8 text: {exc}") from None


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())


def _line(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}"


class _Builder:
    """Turns a composed node graph into values. An alias is the same node object reached twice, so
    the expanded size is measured first (memoised per node, with the DFS path to detect cycles)
    and nothing is built unless the whole document fits."""

    def __init__(self, max_bytes: int, max_depth: int) -> None:
        self.max_bytes, self.max_depth = max_bytes, max_depth
        self.sizes: dict[int, tuple[int, int]] = {}  # node id -> (expanded size, height)
        self.total = 0
        self.visits = 0

    def measure(self, node: yaml.Node, depth: int, path: set[int]) -> tuple[int, int]:
        key = id(node)
        if key in path:
            raise DocumentError(f"invalid YAML: {_line(node)}: an alias refers to the node that contains it")
        known = self.sizes.get(key)
        if known is None:
            known = self._measure_new(node, depth, path)
            self.sizes[key] = known
        else:
            self._add(known[0], node)
        if depth + known[1] - 1 > self.max_depth:
            raise DocumentError(f"invalid YAML: {_line(node)}: nested more than {self.max_depth} levels deep")
        return known

    def _measure_new(self, node: yaml.Node, depth: int, path: set[int]) -> tuple[int, int]:
        self._yield_now_and_then()
        if isinstance(node, yaml.ScalarNode):
            size = len(node.value) + 2
            self._add(size, node)
            return size, 0
        if depth > self.max_depth:
            raise DocumentError(f"invalid YAML: {_line(node)}: nested more than {self.max_depth} levels deep")
        path.add(id(node))
        size, height = 2, 1
        children = node.value if isinstance(node, yaml.SequenceNode) else [c for pair in node.value for c in pair]
        for child in children:
            child_size, child_height = self.measure(child, depth + 1, path)
            size += child_size + 1
            height = max(height, child_height + 1)
        path.discard(id(node))
        return size, height

    def _yield_now_and_then(self) -> None:
        """Let a waiting thread (the event loop) take the GIL every few hundred nodes, rather than
        wait for the interpreter's 5 ms switch interval each time it wakes up."""
        self.visits += 1
        if self.visits % _YIELD_EVERY == 0:
            time.sleep(0)

    def _add(self, size: int, node: yaml.Node) -> None:
        self.total += size
        if self.total > self.max_bytes:
            raise DocumentError(f"invalid YAML: {_line(node)}: the document expands (with its aliases) to more "
                                f"than {self.max_bytes} bytes, the limit for this request")

    def build(self, node: yaml.Node) -> Any:
        self._yield_now_and_then()
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node)
        if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
            return [self.build(item) for item in node.value]
        if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
            return self._mapping(node)
        raise _unsupported(node)

    def _mapping(self, node: yaml.MappingNode) -> dict[str, Any]:
        own: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged = {**self._merge_sources(value_node), **merged}
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise DocumentError(f"invalid YAML: {_line(key_node)}: a mapping key must be a string")
            _scalar(key_node)  # a key obeys the same tag rules; JSON keys are its text
            own[key_node.value] = self.build(value_node)
        return {**merged, **own}

    def _merge_sources(self, node: yaml.Node) -> dict[str, Any]:
        """`<<: *base` or `<<: [*a, *b]`: an earlier source wins over a later one."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for source in reversed(sources):
            value = self.build(source)
            if not isinstance(value, dict):
                raise DocumentError(f"invalid YAML: {_line(source)}: a merge key (<<) needs a mapping")
            merged.update(value)
        return merged


def _unsupported(node: yaml.Node) -> DocumentError:
    return DocumentError(f"invalid YAML: {_line(node)}: the tag {node.tag} is not allowed; only JSON-compatible "
                         "values are (maps, sequences, strings, numbers, booleans, null)")


def _scalar(node: yaml.ScalarNode) -> Any:
    tag = node.tag
    if tag not in _SCALAR_TAGS:
        raise _unsupported(node)
    if tag in (f"{_CORE}str", f"{_CORE}timestamp"):
        return node.value
    if tag == f"{_CORE}null":
        return None
    if tag == f"{_CORE}bool":
        return _CONSTRUCT.construct_yaml_bool(node)
    if tag == f"{_CORE}int":
        return _integer(node)
    return _float(node)


def _integer(node: yaml.ScalarNode) -> int:
    if len(node.value) > _MAX_INT_CHARS:
        raise DocumentError(f"invalid YAML: {_line(node)}: an integer of {len(node.value)} characters does "
                            "not fit in 64 bits")
    try:
        value: int = _CONSTRUCT.construct_yaml_int(node)
    except ValueError:
        raise DocumentError(f"invalid YAML: {_line(node)}: {node.value!r} is not an integer") from None
    if not _INT64_MIN <= value <= _UINT64_MAX:
        raise DocumentError(f"invalid YAML: {_line(node)}: the integer {value} does not fit in 64 bits")
    return value


def _float(node: yaml.ScalarNode) -> float:
    try:
        value: float = _CONSTRUCT.construct_yaml_float(node)
    except ValueError:
        raise DocumentError(f"invalid YAML: {_line(node)}: {node.value!r} is not a number") from None
    if not math.isfinite(value):
        raise DocumentError(f"invalid YAML: {_line(node)}: {node.value} is not a finite number (JSON has none)")
    return value


# --- either ----------------------------------------------------------------------------------------

def load_json_or_yaml(body: bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """JSON first (the common, fast case), then YAML. A JSON document that is well-formed but out
    of bounds (too deep, a number too large) is refused as JSON, not retried as YAML."""
    _utf8(body)
    try:
        with collector_paused():
            value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        json_problem, out_of_bounds = _json_message(exc, max_depth)
        if out_of_bounds:
            raise DocumentError(json_problem) from None
    else:
        check_depth(value, max_depth)
        return value
    return _yaml_value(body, max_bytes, max_depth, syntax_prefix=f"neither JSON nor YAML: {json_problem}; ")
