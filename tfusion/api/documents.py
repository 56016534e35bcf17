"""Bounded decoding of untrusted JSON and YAML documents: the one implementation behind every
request body tfusion reads (the controller's and the hypervisor's edges, and the embedded API
server through `tfusion.apiserver.limits`). It is free of any HTTP framework: errors are
`DocumentError` (its `problem` is the message without the "invalid JSON/YAML: " lead, for an edge
that words its own), which each edge turns into its own 400; `DocumentTooLarge`, a YAML document
over `max_bytes` without any alias, is the one an edge may answer with 413 instead.

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
- numbers are finite and integers fit in 64 bits (signed or unsigned). A JSON integer literal
  beyond 64 bits is read as the nearest float (orjson's reading: 123456789012345678901234567890 is
  1.2345678901234568e29), as kube-apiserver reads it into an unstructured object (a float64); a
  field that wants an integer then refuses that float by its type (400 naming the field), so no
  reader ever sees an integer beyond 64 bits. A JSON literal too large for a float is refused. A
  YAML integer beyond 64 bits is refused too (PyYAML would build it exactly, at a cost that grows
  with its length; kube's YAML reader would round it to a float). `check_value` makes the same
  checks (and the depth one) on a value decoded some other way or built by a patch.

Freeing matters as much as building: a composed node graph of a few MiB is dismantled piece by
piece (`_dismantle`), and the cyclic collector is paused meanwhile (`collector_paused`), so that a
parse in a worker thread does not hold the GIL, and with it the event loop, for 100 ms at a time.

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

from tfusion.api.jsontypes import JsonObject, JsonValue

MAX_DEPTH = 100
#: bodies above this are decoded (and encoded) in a worker thread, off the event loop: a few MiB take a
#: few hundred ms (the API server's request bodies, the webhook's AdmissionReviews)
THREAD_THRESHOLD = 256 * 1024
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
    """A document that is not readable within the bounds; the message says what and where.

    `problem` is the message without its "invalid JSON: " / "invalid YAML: " lead (`syntax`)."""

    def __init__(self, problem: str, syntax: str = "") -> None:
        super().__init__(f"invalid {syntax}: {problem}" if syntax else problem)
        self.problem = problem


class DocumentTooLarge(DocumentError):
    """A YAML document larger than `max_bytes` by its own text, not through aliases: a big document
    rather than an alias bomb, which an edge may answer with 413. `size` is what was counted when
    the limit was passed (the document is at least that large)."""

    def __init__(self, problem: str, size: int) -> None:
        super().__init__(problem, "YAML")
        self.size = size


# --- JSON -------------------------------------------------------------------------------------------

def load_json(body: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON document, at most `max_depth` levels deep, numbers finite; an integer literal
    beyond 64 bits comes back as a float (see the module docstring), never as a larger int."""
    try:
        with collector_paused():
            value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        problem, _ = _json_problem(exc, max_depth)
        raise DocumentError(problem, "JSON") from None
    check_decoded(value, body, max_depth)
    return value


def _json_problem(exc: orjson.JSONDecodeError, max_depth: int) -> tuple[str, bool]:
    """What was wrong, and whether it was a well-formed document out of bounds (not a syntax error)."""
    text = str(exc)
    if "depth limit" in text:
        return f"nested more than {max_depth} levels deep", True
    if "infinity" in text:
        return f"a number is too large ({text})", True
    return text, False


def check_value(value: Any, max_depth: int = MAX_DEPTH, *, syntax: str = "") -> None:
    """Refuse a decoded value whose objects and arrays nest deeper than `max_depth`, or that holds an
    integer beyond 64 bits or a float that is not finite (no recursion)."""
    _check_number(value, syntax)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise DocumentError(f"nested more than {max_depth} levels deep", syntax)
        for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif isinstance(child, int | float):
                _check_number(child, syntax)


def check_decoded(value: Any, body: bytes, max_depth: int = MAX_DEPTH) -> None:
    """`check_value` for what orjson decoded from `body`. Each level of nesting opens with a
    bracket, so a body with no more brackets than `max_depth` (those inside strings counted too,
    which only errs towards checking) cannot nest too deep, and orjson has already bounded its
    numbers (an integer beyond 64 bits read as a float, a literal too large for one refused): it is
    not walked at all, which is most pods and reviews, counted at C speed."""
    if body.count(b"{") + body.count(b"[") > max_depth:
        check_value(value, max_depth, syntax="JSON")


def _check_number(value: Any, syntax: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise DocumentError(f"{value} is not a finite number (JSON has none)", syntax)
    if isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
        digits = str(value) if value.bit_length() < 200 else f"of about {int(value.bit_length() * 0.30103)} digits"
        raise DocumentError(f"the integer {digits} does not fit in 64 bits", syntax)


# --- YAML -------------------------------------------------------------------------------------------

def load_yaml(body: bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """One YAML document as JSON-compatible values; aliases may expand to at most `max_bytes`."""
    return _yaml_value(body, max_bytes, max_depth, json_problem="")


def _yaml_value(body: bytes, max_bytes: int, max_depth: int, *, json_problem: str) -> Any:
    """`json_problem`: why the body was not JSON, when it was tried as JSON first."""
    text = _utf8(body)  # libyaml would guess UTF-16 from a byte-order mark; JSON and kube speak UTF-8
    with collector_paused():
        try:
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.YAMLError as exc:
            if json_problem:
                raise DocumentError(f"neither JSON nor YAML: {json_problem}; invalid YAML: {_one_line(exc)}") from None
            raise DocumentError(_one_line(exc), "YAML") from None
        if node is None:
            return None
        try:
            builder = _Builder(max_bytes, max_depth)
            builder.measure(node, 1, set())
            return builder.build(node)
        finally:
            _dismantle(node)


_pause_lock = threading.Lock()
_pauses = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off while a document is parsed.

    Composing a few MiB of YAML (or decoding as much JSON) allocates hundreds of thousands of
    objects; that triggers full collections, each of which holds the GIL for 100 ms or more in a
    process with a large heap (measured: 80-140 ms in `--role=all`, 300-500 ms in the API server
    for a 3 MiB body, against 13 ms without them), stalling the event loop even though the parse
    runs in a worker thread. Neither a node graph (a cyclic alias is refused) nor decoded JSON has
    cycles, so reference counting frees them and postponing collection frees nothing late. The
    pauses nest, across threads and roles: the collector is switched back on when the last ends,
    and only if it was on before the first. `tfusion.web.decode_body` and the API server's body
    reader hold it around the whole decoding of a large body (checks too); an informer holds it
    while its initial list is applied page by page."""
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


def freeze_long_lived(*, collect: bool = True) -> None:
    """Take every object alive now out of the cyclic collector's walks (`gc.freeze`), garbage
    collected first (with `collect`) so that none is frozen with them. For a process that has just
    loaded what it keeps for its lifetime (a cache of the cluster, a stored state): a full
    collection walks every object in its generations, seconds at 100,000 pods, holding the GIL and
    the event loop. A frozen object is still freed by reference counting when it goes."""
    if collect:
        gc.collect()
    gc.freeze()


#: the youngest generation's collection threshold in a tfusion process that serves (Python's is 700)
SERVER_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def young_threshold_raised() -> Iterator[None]:
    """Collect the youngest generation after 10,000 net container allocations instead of 700,
    while a role runs (put back after: tests call the entry point in-process). Python's default
    suits small scripts; a server that decodes a 7 KB pod per request (about 500 dicts and lists,
    nearly all freed by reference counting when the request ends) crossed it every request or two,
    and each collection walked whatever the requests in flight still held: about 10 % of the
    embedded API server's CPU while it built `benchmarks/scale.py`'s cluster. Only cyclic garbage
    waits longer to be found, and requests make next to none."""
    before = gc.get_threshold()
    gc.set_threshold(SERVER_YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"the document is not UTF-8 text: {exc}") from None


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())


def _line(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}"


def _yield_now_and_then(count: int) -> None:
    """Let a waiting thread (the event loop) take the GIL every few hundred nodes, rather than wait
    for the interpreter's 5 ms switch interval each time it wakes up."""
    if count % _YIELD_EVERY == 0:
        time.sleep(0)


def _dismantle(root: yaml.Node) -> None:
    """Free a node graph piece by piece. Dropped at once, a graph of a few MiB is freed in one C call
    that holds the GIL (and so the event loop) for about 80 ms; this loop lets other threads in."""
    stack = [root]
    freed = 0
    while stack:
        node = stack.pop()
        freed += 1
        _yield_now_and_then(freed)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
            node.value = []
        elif isinstance(node, yaml.MappingNode):
            stack.extend(child for pair in node.value for child in pair)
            node.value = []


class _Builder:
    """Turns a composed node graph into values. An alias is the same node object reached twice, so
    the expanded size is measured first (memoised per node, with the DFS path to detect cycles)
    and nothing is built unless the whole document fits."""

    def __init__(self, max_bytes: int, max_depth: int) -> None:
        self.max_bytes, self.max_depth = max_bytes, max_depth
        self.sizes: dict[int, tuple[int, int]] = {}  # node id -> (expanded size, height)
        self.total = 0
        self.visits = 0
        #: whether an alias has been expanded: then a document over the limit is an alias bomb
        self.aliased = False

    def measure(self, node: yaml.Node, depth: int, path: set[int]) -> tuple[int, int]:
        key = id(node)
        if key in path:
            raise DocumentError(f"{_line(node)}: an alias refers to the node that contains it", "YAML")
        known = self.sizes.get(key)
        if known is None:
            known = self._measure_new(node, depth, path)
            self.sizes[key] = known
        else:
            self.aliased = True
            self._add(known[0], node)
        if depth + known[1] - 1 > self.max_depth:
            raise self._too_deep(node)
        return known

    def _measure_new(self, node: yaml.Node, depth: int, path: set[int]) -> tuple[int, int]:
        self._visit()
        if isinstance(node, yaml.ScalarNode):
            size = len(node.value) + 2
            self._add(size, node)
            return size, 0
        if depth > self.max_depth:
            raise self._too_deep(node)
        path.add(id(node))
        size, height = 2, 1
        children = node.value if isinstance(node, yaml.SequenceNode) else [c for pair in node.value for c in pair]
        for child in children:
            child_size, child_height = self.measure(child, depth + 1, path)
            size += child_size + 1
            height = max(height, child_height + 1)
        path.discard(id(node))
        return size, height

    def _too_deep(self, node: yaml.Node) -> DocumentError:
        return DocumentError(f"{_line(node)}: nested more than {self.max_depth} levels deep", "YAML")

    def _visit(self) -> None:
        self.visits += 1
        _yield_now_and_then(self.visits)

    def _add(self, size: int, node: yaml.Node) -> None:
        self.total += size
        if self.total <= self.max_bytes:
            return
        if not self.aliased:
            raise DocumentTooLarge(f"{_line(node)}: the document is larger than {self.max_bytes} bytes (counted "
                                   "as JSON), the limit for this request", self.total)
        raise DocumentError(f"{_line(node)}: the document expands (with its aliases) to more than "
                            f"{self.max_bytes} bytes, the limit for this request", "YAML")

    def build(self, node: yaml.Node) -> JsonValue:
        self._visit()
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node)
        if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
            return [self.build(item) for item in node.value]
        if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
            return self._mapping(node)
        raise _unsupported(node)

    def _mapping(self, node: yaml.MappingNode) -> JsonObject:
        own: JsonObject = {}
        merged: JsonObject = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged = {**self._merge_sources(value_node), **merged}
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise DocumentError(f"{_line(key_node)}: a mapping key must be a string", "YAML")
            _scalar(key_node)  # a key obeys the same tag rules; JSON keys are its text
            own[key_node.value] = self.build(value_node)
        return {**merged, **own}

    def _merge_sources(self, node: yaml.Node) -> JsonObject:
        """`<<: *base` or `<<: [*a, *b]`: an earlier source wins over a later one (and the mapping's
        own keys over all of them)."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: JsonObject = {}
        for source in reversed(sources):
            value = self.build(source)
            if not isinstance(value, dict):
                raise DocumentError(f"{_line(source)}: a merge key (<<) needs a mapping", "YAML")
            merged.update(value)
        return merged


def _unsupported(node: yaml.Node) -> DocumentError:
    return DocumentError(f"{_line(node)}: the tag {node.tag} is not allowed; only JSON-compatible values are "
                         "(maps, sequences, strings, numbers, booleans, null)", "YAML")


def _scalar(node: yaml.ScalarNode) -> JsonValue:
    tag = node.tag
    if tag not in _SCALAR_TAGS:
        raise _unsupported(node)
    if tag in (f"{_CORE}str", f"{_CORE}timestamp"):
        text: str = node.value  # a scalar node's value is its text
        return text
    if tag == f"{_CORE}null":
        return None
    if tag == f"{_CORE}bool":
        return _CONSTRUCT.construct_yaml_bool(node)
    if tag == f"{_CORE}int":
        return _integer(node)
    return _float(node)


def _integer(node: yaml.ScalarNode) -> int:
    if len(node.value) > _MAX_INT_CHARS:
        raise DocumentError(f"{_line(node)}: an integer of {len(node.value)} characters does not fit in 64 bits",
                            "YAML")
    try:
        value: int = _CONSTRUCT.construct_yaml_int(node)
    except ValueError:
        raise DocumentError(f"{_line(node)}: {node.value!r} is not an integer", "YAML") from None
    if not _INT64_MIN <= value <= _UINT64_MAX:
        raise DocumentError(f"{_line(node)}: the integer {value} does not fit in 64 bits", "YAML")
    return value


def _float(node: yaml.ScalarNode) -> float:
    try:
        value: float = _CONSTRUCT.construct_yaml_float(node)
    except ValueError:
        raise DocumentError(f"{_line(node)}: {node.value!r} is not a number", "YAML") from None
    if not math.isfinite(value):
        raise DocumentError(f"{_line(node)}: {node.value} is not a finite number (JSON has none)", "YAML")
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
        json_problem, out_of_bounds = _json_problem(exc, max_depth)
        if out_of_bounds:
            raise DocumentError(json_problem, "JSON") from None
    else:
        check_decoded(value, body, max_depth)
        return value
    return _yaml_value(body, max_bytes, max_depth, json_problem=f"invalid JSON: {json_problem}")
