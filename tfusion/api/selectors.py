r"""Label and field selectors, parsed once and matched against every object a list or watch sees.

The grammar and semantics are those of k8s.io/apimachinery (`labels.Parse`, `fields.ParseSelector`,
`metav1.LabelSelectorAsSelector`):

- label selector text: comma-separated requirements, all of which must hold:
  `k=v`, `k==v`, `k!=v` (true when the label is absent), `k in (a,b)`, `k notin (a,b)` (true when
  absent), `k` (exists), `!k` (does not exist), `k>1` / `k<1` (integer comparison, absent fails).
  Keys are qualified names (`[prefix/]name`), values are label values (63 chars at most).
- metav1.LabelSelector dicts: `matchLabels` plus `matchExpressions` with In/NotIn/Exists/DoesNotExist.
  An empty selector matches everything; a missing (None) selector matches nothing.
- field selector text: `path=v`, `path==v`, `path!=v`, comma-separated; `\\`, `\,` and `\=` escape.
  A path is dotted (`metadata.name`, `spec.nodeName`, any other); a missing field reads as "".
  Which paths a kind supports is the caller's business (kube-apiserver answers 400 for others).

Errors raise `SelectorError` (a `ValueError`) saying which requirement, what value, what is allowed.

It sits in `api/`, below every other layer, because settings (node selector options), the
controller (pool node selectors, webhook object selectors) and the embedded API server all parse
and match selectors with the same grammar.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "EVERYTHING",
    "NOTHING",
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "SelectorError",
    "label_selector_from_dict",
    "parse_field_selector",
    "parse_label_selector",
]


class SelectorError(ValueError):
    """A selector that does not parse or does not validate."""


Operator = Literal["=", "==", "!=", "in", "notin", "exists", "!", "gt", "lt"]

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_RULE = (
    "must be 63 characters or less, begin and end with an alphanumeric character, "
    "and contain only alphanumerics, '-', '_' or '.'"
)


def _validate_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        raise SelectorError(f"invalid label key {key!r}: prefix part must be non-empty")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.match(prefix)):
        raise SelectorError(
            f"invalid label key {key!r}: prefix {prefix!r} must be a lowercase DNS subdomain (253 characters or less)"
        )
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        raise SelectorError(f"invalid label key {key!r}: name part {_NAME_RULE}")


def _validate_value(key: str, value: str) -> None:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise SelectorError(f"invalid label value {value!r} for key {key!r}: a label value {_NAME_RULE}")


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement: `key operator values`. Equality operators are kept as written so that
    `str()` round-trips; matching treats `=`/`==` as `in` and `!=` as `notin`."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def compile(self) -> Callable[[Mapping[str, str]], bool]:
        key, op = self.key, self.operator
        if op in ("=", "==", "in"):
            allowed = frozenset(self.values)
            return lambda labels: labels.get(key) in allowed
        if op in ("!=", "notin"):
            banned = frozenset(self.values)
            return lambda labels: labels.get(key) not in banned
        if op == "exists":
            return lambda labels: key in labels
        if op == "!":
            return lambda labels: key not in labels
        bound = int(self.values[0])
        greater = op == "gt"

        def compare(labels: Mapping[str, str]) -> bool:
            raw = labels.get(key)
            if raw is None:
                return False
            try:
                number = int(raw)
            except ValueError:
                return False
            return number > bound if greater else number < bound

        return compare

    def __str__(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in ("in", "notin"):
            return f"{self.key} {self.operator} ({','.join(sorted(self.values))})"
        symbol = {"gt": ">", "lt": "<"}.get(self.operator, self.operator)
        return f"{self.key}{symbol}{self.values[0]}"


class LabelSelector:
    """A compiled label selector. `matches_nothing` is the nil metav1.LabelSelector."""

    __slots__ = ("_checks", "matches_nothing", "requirements")

    def __init__(self, requirements: tuple[LabelRequirement, ...] = (), *, matches_nothing: bool = False):
        self.requirements = requirements
        self.matches_nothing = matches_nothing
        self._checks = tuple(r.compile() for r in requirements)

    @property
    def empty(self) -> bool:
        """True for a selector that matches everything (no requirements)."""
        return not self.requirements and not self.matches_nothing

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.matches_nothing:
            return False
        present = labels if labels is not None else {}
        return all(check(present) for check in self._checks)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return "LabelSelector(<nothing>)" if self.matches_nothing else f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LabelSelector)
            and self.requirements == other.requirements
            and self.matches_nothing == other.matches_nothing
        )

    def __hash__(self) -> int:
        return hash((self.requirements, self.matches_nothing))


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(matches_nothing=True)

# ---------------------------------------------------------------------------------------------
# label selector text

_TOKEN_RE = re.compile(r"\s*(==|!=|=|,|\(|\)|!|<|>|[^!=,()<>\s]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:  # only trailing whitespace is left
            break
        out.append(match.group(1))
        pos = match.end()
    return out


class _LabelParser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def fail(self, problem: str) -> SelectorError:
        return SelectorError(f"unable to parse label selector {self.text!r}: {problem}")

    def identifier(self, what: str) -> str:
        token = self.take()
        if token is None or (token in _SPECIAL_TOKENS):
            found = "end of selector" if token is None else repr(token)
            raise self.fail(f"expected {what}, found {found}")
        return token

    def parse(self) -> tuple[LabelRequirement, ...]:
        requirements: list[LabelRequirement] = []
        if self.peek() is None:
            return ()
        while True:
            requirements.append(self.requirement())
            token = self.take()
            if token is None:
                return tuple(requirements)
            if token != ",":
                raise self.fail(f"expected ',' or end of selector after {requirements[-1]}, found {token!r}")

    def requirement(self) -> LabelRequirement:
        if self.peek() == "!":
            self.take()
            key = self.identifier("a label key after '!'")
            _validate_key(key)
            return LabelRequirement(key, "!")
        key = self.identifier("a label key")
        _validate_key(key)
        op = self.peek()
        if op is None or op == ",":
            return LabelRequirement(key, "exists")
        self.take()
        if op in ("=", "==", "!="):
            value = self.single_value(key)
            return LabelRequirement(key, op, (value,))  # type: ignore[arg-type]
        if op in (">", "<"):
            value = self.identifier(f"an integer after '{key}{op}'")
            if not re.fullmatch(r"-?\d+", value):
                raise self.fail(f"value {value!r} for {key}{op} must be an integer")
            return LabelRequirement(key, "gt" if op == ">" else "lt", (value,))
        if op in ("in", "notin"):
            return LabelRequirement(key, op, self.value_set(key))  # type: ignore[arg-type]
        raise self.fail(f"unknown operator {op!r} after key {key!r}; allowed: =, ==, !=, in, notin, <, >")

    def single_value(self, key: str) -> str:
        token = self.peek()
        if token is None or token == ",":
            return ""  # `key=` selects the empty value
        if token in _SPECIAL_TOKENS:
            raise self.fail(f"expected a value for key {key!r}, found {token!r}")
        self.take()
        _validate_value(key, token)
        return token

    def value_set(self, key: str) -> tuple[str, ...]:
        if self.take() != "(":
            raise self.fail(f"expected '(' to open the value set for key {key!r}")
        values: list[str] = []
        expect_value = True
        while True:
            token = self.take()
            if token is None:
                raise self.fail(f"unterminated value set for key {key!r}: missing ')'")
            if token == ")":
                if expect_value:
                    values.append("")
                break
            if token == ",":
                if expect_value:
                    values.append("")
                expect_value = True
                continue
            if token in _SPECIAL_TOKENS or not expect_value:
                raise self.fail(f"unexpected {token!r} in the value set for key {key!r}")
            _validate_value(key, token)
            values.append(token)
            expect_value = False
        return tuple(dict.fromkeys(values))


_SPECIAL_TOKENS = frozenset({"==", "!=", "=", ",", "(", ")", "!", "<", ">"})


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse the `labelSelector` query parameter; empty text selects everything."""
    if text is None or not text.strip():
        return EVERYTHING
    return LabelSelector(_LabelParser(text).parse())


# ---------------------------------------------------------------------------------------------
# metav1.LabelSelector

_EXPRESSION_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def label_selector_from_dict(selector: Mapping[str, Any] | None, *, field: str = "selector") -> LabelSelector:
    """Compile a metav1.LabelSelector; None (a nil selector) matches nothing, {} everything."""
    if selector is None:
        return NOTHING
    if not isinstance(selector, Mapping):
        raise SelectorError(f"{field}: must be an object with matchLabels/matchExpressions")
    requirements: list[LabelRequirement] = []
    match_labels = selector.get("matchLabels")
    match_labels = {} if match_labels is None else match_labels
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{field}.matchLabels: must be a map of label key to value")
    for key, value in match_labels.items():
        try:
            _check_pair(key, value)
        except SelectorError as exc:
            raise SelectorError(f"{field}.matchLabels: {exc}") from None
        requirements.append(LabelRequirement(key, "in", (value,)))
    expressions = selector.get("matchExpressions")
    expressions = [] if expressions is None else expressions
    if not isinstance(expressions, list):
        raise SelectorError(f"{field}.matchExpressions: must be a list")
    for index, expression in enumerate(expressions):
        requirements.append(_expression(expression, f"{field}.matchExpressions[{index}]"))
    return LabelSelector(tuple(requirements))


def _check_pair(key: Any, value: Any) -> None:
    if not isinstance(key, str) or not isinstance(value, str):
        raise SelectorError(f"label key and value must be strings, got {key!r}: {value!r}")
    _validate_key(key)
    _validate_value(key, value)


def _checked(where: str, check: Callable[[], None]) -> None:
    try:
        check()
    except SelectorError as exc:
        raise SelectorError(f"{where}: {exc}") from None


def _expression(expression: Any, where: str) -> LabelRequirement:
    if not isinstance(expression, Mapping):
        raise SelectorError(f"{where}: must be an object with key, operator, values")
    key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    if not isinstance(key, str):
        raise SelectorError(f"{where}.key: required string, got {key!r}")
    _checked(f"{where}.key", lambda: _validate_key(key))
    op = _EXPRESSION_OPERATORS.get(operator) if isinstance(operator, str) else None
    if op is None:
        allowed = ", ".join(_EXPRESSION_OPERATORS)
        raise SelectorError(f"{where}.operator: unsupported value {operator!r}; allowed: {allowed}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError(f"{where}.values: must be a list of strings")
    if op in ("in", "notin") and not values:
        raise SelectorError(f"{where}.values: must be non-empty for operator {operator}")
    if op in ("exists", "!") and values:
        raise SelectorError(f"{where}.values: must be empty for operator {operator}")
    for value in values:
        try:
            _validate_value(key, value)
        except SelectorError as exc:
            raise SelectorError(f"{where}.values: {exc}") from None
    return LabelRequirement(key, op, tuple(dict.fromkeys(values)))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# field selectors


@dataclass(frozen=True)
class FieldRequirement:
    """`path = value` or `path != value` over a dotted field path."""

    path: str
    operator: Literal["=", "!="]
    value: str

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.path}{self.operator}{escaped}"


def _field_text(obj: Mapping[str, Any], parts: tuple[str, ...]) -> str:
    node: Any = obj
    for part in parts:
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
        if node is None:
            return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, str):
        return node
    if isinstance(node, int | float):
        return str(node)
    return ""


class FieldSelector:
    """A compiled field selector over plain JSON objects."""

    __slots__ = ("_compiled", "requirements")

    def __init__(self, requirements: tuple[FieldRequirement, ...] = ()):
        self.requirements = requirements
        self._compiled = tuple((tuple(r.path.split(".")), r.operator == "=", r.value) for r in requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    @property
    def paths(self) -> frozenset[str]:
        """The field paths this selector reads (for a per-kind "field label not supported" check)."""
        return frozenset(r.path for r in self.requirements)

    def value_for(self, path: str) -> str | None:
        """The value an `=` requirement demands of `path`, for index lookups (None if none)."""
        for r in self.requirements:
            if r.path == path and r.operator == "=":
                return r.value
        return None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for parts, equal, value in self._compiled:  # noqa: SIM110 - a plain loop is faster here
            if (_field_text(obj, parts) == value) != equal:
                return False
        return True

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return f"FieldSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldSelector) and self.requirements == other.requirements

    def __hash__(self) -> int:
        return hash(self.requirements)


_FIELD_PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def _unescape_field_value(raw: str, term: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector term {term!r}: '\\' must be followed by '\\', ',' or '='")
            out.append(raw[i + 1])
            i += 2
            continue
        if char in ",=":
            raise SelectorError(f"invalid field selector term {term!r}: unescaped {char!r} in the value")
        out.append(char)
        i += 1
    return "".join(out)


def _field_term(term: str) -> FieldRequirement:
    for symbol, operator in (("!=", "!="), ("==", "="), ("=", "=")):
        at = term.find(symbol)
        if at > 0:
            path = term[:at].strip()
            if not _FIELD_PATH_RE.match(path):
                raise SelectorError(
                    f"invalid field selector term {term!r}: field path {path!r} must be dot-separated names"
                )
            value = _unescape_field_value(term[at + len(symbol) :], term)
            return FieldRequirement(path, operator, value)  # type: ignore[arg-type]
    raise SelectorError(
        f"invalid field selector term {term!r}: expected <field>=<value>, <field>==<value> or <field>!=<value>"
    )


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parse the `fieldSelector` query parameter; empty text selects everything."""
    if text is None or not text.strip():
        return FieldSelector()
    terms = _split_unescaped(text, ",")
    # like kube-apiserver, only the path is trimmed: "name= x" demands the value " x"
    return FieldSelector(tuple(_field_term(t) for t in terms if t.strip()))
