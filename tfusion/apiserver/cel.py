"""CRD validation rules (`x-kubernetes-validations`, CEL) evaluated as kube-apiserver evaluates them.

A CRD's rules are compiled once per distinct schema (cached by a hash of the schema, so a CRD
update that changes a rule compiles afresh) and a CRD whose rules do not compile is refused at create or
update with 422 at the rule's field path. Custom objects are then checked on every write (create,
update, each patch type, status): the schema is walked together with the object, `self` is the
value at the node that carries the rule and `oldSelf` the correlated old value. As in kube:
- a rule that mentions `oldSelf` (a transition rule) runs only on update and only where an old value
  correlates (object properties, map values, items of `x-kubernetes-list-type: map` lists by key);
  such a rule under an uncorrelatable list is refused when the CRD is written;
- ratcheting: a failing rule without `oldSelf` is forgiven where the value is unchanged from the old
  object, so a status write is not refused for a spec that predates a rule;
- the root rule sees `apiVersion`, `kind` and `metadata` limited to `name` and `generateName`;
- `integer` values are CEL ints, `number` values doubles, int-or-string and free-form values
  whatever JSON they are; `message`, `messageExpression`, `reason` and `fieldPath` are honoured.

The CEL engine is cel-python (`celpy`): a pure-Python interpreter of the CEL spec (macros, has(),
string functions, regular expressions through RE2, heterogeneous lists and maps). It parses but does
not type-check, so our compile step adds what kube's checker reports most often: syntax errors and
references to variables other than `self`, `oldSelf` and macro variables. Type errors (a string
compared with an int, a field the schema does not have) surface at evaluation as
"... evaluating rule: ..." errors, which kube would already report at CRD creation.

Bound: kube charges a cost per CEL operation (1,000,000 per expression, 10,000,000 per object).
Validation here runs inside the store's atomic write step on the event loop, so it cannot be moved
to a thread and awaited; instead every AST node the interpreter visits costs one step, with at most
`RULE_STEP_LIMIT` steps per rule evaluation and `OBJECT_STEP_BUDGET` steps for all rules of one
object. At about 10 µs a step (cel-python is an AST interpreter) that caps one write's CEL time near
a second whatever the rule or the list size; a macro over a list costs about 17 steps an item, so
`self.all(x, x > 0)` fits lists of about 2,500 items. Running out gives kube's messages and stops
further rule evaluation for that object. Converting the JSON to CEL values is not metered: it is
linear and cheap (under a microsecond a value, about a second for a 3 MiB body of small numbers).
Rules run only on objects that passed schema validation, since they assume the schema's types.

ValidatingAdmissionPolicy expressions (policies.py) use the same compiler, evaluator and meter with
their own variables. Where cel-python departs from cel-go on something policies lean on, evaluation
follows cel-go: a map or a list compared with null is simply unequal (`oldObject != null`).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import celpy
import lark
import orjson
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, bool_eq, bool_ne

from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

RULE_STEP_LIMIT: Final = 50_000
OBJECT_STEP_BUDGET: Final = 100_000
_CACHE_SIZE: Final = 128
#: the interpreter recurses a few Python frames per AST level and an expression about 50 parentheses
#: deep already exhausts Python's stack at evaluation; each parenthesis costs about ten levels, so this
#: allows some twenty nested parentheses, and ordinary rules stay under 40 levels
MAX_AST_DEPTH: Final = 250
_MESSAGE_EXPRESSION_MAX: Final = 5 * 1024
_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: names CEL resolves without a declaration (type values usable in `type(x) == int`)
_BUILTIN_NAMES: Final = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn"}
)
_REASONS: Final = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
_BUDGET_MESSAGE: Final = "validation failed due to running out of cost budget, no further validation rules will be run"

Schema = dict[str, Any]
Ast = lark.Tree[Any]

_environment: celpy.Environment | None = None


def _env() -> celpy.Environment:
    global _environment
    if _environment is None:
        _environment = celpy.Environment()
    return _environment


# ------------------------------------------------------------------------------ compiling
@dataclass(frozen=True)
class CompiledRule:
    text: str
    ast: Ast
    uses_old_self: bool
    message: str = ""
    message_expression: Ast | None = None
    reason: str = "FieldValueInvalid"
    field_path: str = ""  # relative field path from `fieldPath`, already in kube's notation

    @property
    def error_text(self) -> str:
        """What kube names a rule by in error messages: its message if it has one, else its text."""
        return self.message or self.text.strip()


@dataclass
class RuleNode:
    """The rules at one schema node and the nodes below it that have rules (others are left out)."""

    schema: Schema
    rules: list[CompiledRule] = field(default_factory=list)
    properties: dict[str, RuleNode] = field(default_factory=dict)
    additional: RuleNode | None = None
    items: RuleNode | None = None

    def empty(self) -> bool:
        return not (self.rules or self.properties or self.additional or self.items)


class CompileError(Exception):
    pass


#: the variables of a CRD validation rule
RULE_VARIABLES: Final = frozenset({"self", "oldSelf"})


def compile_expression(text: str, declared: frozenset[str] = RULE_VARIABLES) -> tuple[Ast, bool]:
    """Parse `text` and check that it reads only `declared` variables (and macro variables);
    returns the AST and whether it uses `oldSelf`."""
    try:
        ast = _env().compile(text)
    except Exception as exc:  # celpy raises CELParseError and lark errors alike for bad syntax
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f" at line {line}, column {column + 1}" if isinstance(line, int) and isinstance(column, int) else ""
        shown = " ".join(str(exc).split())
        raise CompileError(f"syntax error{where}: {shown}") from None
    depth = _depth(ast)
    if depth > MAX_AST_DEPTH:
        raise CompileError(f"expression nests {depth} levels deep, at most {MAX_AST_DEPTH} are allowed")
    names = _identifiers(ast)
    bound = _macro_variables(ast)
    for name in names:
        if name not in bound and name not in _BUILTIN_NAMES and name not in declared:
            raise CompileError(f"undeclared reference to '{name}' (in container '')")
    return ast, "oldSelf" in names and "oldSelf" not in bound


def _depth(ast: Ast) -> int:
    """How deep the tree is (without recursing: it is the recursion this bounds)."""
    deepest, stack = 0, [(ast, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in node.children if isinstance(child, lark.Tree))
    return deepest


def _identifiers(ast: Ast) -> list[str]:
    return [str(node.children[0]) for node in ast.iter_subtrees() if node.data == "ident" and node.children]


def _macro_variables(ast: Ast) -> set[str]:
    bound: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data != "member_dot_arg" or len(node.children) < 3 or str(node.children[1]) not in _MACROS:
            continue
        arguments = node.children[2]
        if isinstance(arguments, lark.Tree) and arguments.children and isinstance(arguments.children[0], lark.Tree):
            bound.update(_identifiers(arguments.children[0]))
    return bound


def compile_schema(
    schema: Schema, path: str = "openAPIV3Schema", correlatable: bool = True
) -> tuple[RuleNode, list[Cause]]:
    """Compile every rule under `schema`; causes name the CRD field of each rule that fails."""
    node, causes = RuleNode(schema), []
    for i, raw in enumerate(schema.get("x-kubernetes-validations") or []):
        rule, rule_causes = _compile_rule(raw, f"{path}.x-kubernetes-validations[{i}]", correlatable)
        causes += rule_causes
        if rule is not None:
            node.rules.append(rule)
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            child, child_causes = compile_schema(sub, f"{path}.properties[{name}]", correlatable)
            causes += child_causes
            if not child.empty():
                node.properties[name] = child
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        child, child_causes = compile_schema(
            additional, f"{path}.additionalProperties", correlatable and schema.get("x-kubernetes-map-type") != "atomic"
        )
        causes += child_causes
        node.additional = None if child.empty() else child
    items = schema.get("items")
    if isinstance(items, dict):
        child, child_causes = compile_schema(
            items, f"{path}.items", correlatable and schema.get("x-kubernetes-list-type") == "map"
        )
        causes += child_causes
        node.items = None if child.empty() else child
    return node, causes


def _compile_rule(raw: Any, path: str, correlatable: bool) -> tuple[CompiledRule | None, list[Cause]]:
    if not isinstance(raw, dict):
        return None, [invalid_value(path, raw, "must be an object with a rule")]
    text = raw.get("rule")
    if not isinstance(text, str) or not text.strip():
        return None, [required(f"{path}.rule")]
    causes: list[Cause] = []
    try:
        ast, uses_old_self = compile_expression(text)
    except CompileError as exc:
        return None, [invalid_value(f"{path}.rule", text, f"compilation failed: {exc}")]
    if uses_old_self and not correlatable:
        causes.append(
            invalid_value(f"{path}.rule", text, "oldSelf cannot be used on the uncorrelatable portion of the schema")
        )
    message_expression = None
    source = raw.get("messageExpression")
    if isinstance(source, str) and source.strip():
        try:
            message_expression, _ = compile_expression(source)
        except CompileError as exc:
            causes.append(
                invalid_value(f"{path}.messageExpression", source, f"messageExpression compilation failed: {exc}")
            )
    reason = raw.get("reason") or "FieldValueInvalid"
    if reason not in _REASONS:
        supported = ", ".join(f'"{r}"' for r in _REASONS)
        unsupported = f'Unsupported value: "{reason}": supported values: {supported}'
        causes.append((f"{path}.reason", "FieldValueNotSupported", unsupported))
    field_path = raw.get("fieldPath") or ""
    normalized = _normalize_field_path(field_path) if isinstance(field_path, str) else None
    if normalized is None:
        causes.append(invalid_value(f"{path}.fieldPath", field_path, "must be a valid path such as .a.b or ['a.b']"))
    if causes:
        return None, causes
    message = raw.get("message")
    return CompiledRule(
        text=text,
        ast=ast,
        uses_old_self=uses_old_self,
        message=message.strip() if isinstance(message, str) else "",
        message_expression=message_expression,
        reason=reason,
        field_path=normalized or "",
    ), []


_FIELD_PATH_PART = re.compile(r"\.([A-Za-z_$][A-Za-z0-9_$-]*)|\['((?:[^'\\]|\\.)*)'\]")


def _normalize_field_path(text: str) -> str | None:
    """`.spec.a['b.c']` -> `spec.a[b.c]`-style segments kube appends to a rule's path; None if malformed."""
    if not text:
        return ""
    parts, position = [], 0
    while position < len(text):
        match = _FIELD_PATH_PART.match(text, position)
        if match is None:
            return None
        parts.append(match.group(1) if match.group(1) is not None else match.group(2).replace("\\'", "'"))
        position = match.end()
    return ".".join(parts)


def crd_rule_causes(crd: dict[str, Any]) -> list[Cause]:
    """Rules of a CRD that do not compile, at kube's field paths (spec.validation when versions share a schema)."""
    versions = [v for v in ((crd.get("spec") or {}).get("versions") or []) if isinstance(v, dict)]
    found = [(v.get("schema") or {}).get("openAPIV3Schema") for v in versions]
    schemas: list[Schema] = [s for s in found if isinstance(s, dict)]
    if not schemas or len(schemas) != len(found):
        return []
    if all(s == schemas[0] for s in schemas):
        return compile_schema(schemas[0], "spec.validation.openAPIV3Schema")[1]
    causes: list[Cause] = []
    for i, schema in enumerate(schemas):
        causes += compile_schema(schema, f"spec.versions[{i}].schema.openAPIV3Schema")[1]
    return causes


_compiled: OrderedDict[str, RuleNode | None] = OrderedDict()


def rules_for(schema: Schema) -> RuleNode | None:
    """The compiled rules of a served schema (None if it has none), compiled once per distinct schema."""
    key = hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()
    if key in _compiled:
        _compiled.move_to_end(key)
        return _compiled[key]
    node, _ = compile_schema(schema)
    result = None if node.empty() else node
    _compiled[key] = result
    if len(_compiled) > _CACHE_SIZE:
        _compiled.popitem(last=False)
    return result


# ------------------------------------------------------------------------------ evaluating
class _OutOfSteps(BaseException):
    """Raised from inside the interpreter; a BaseException so that celpy's own error capture
    (which turns `Exception`s into CEL error values) cannot swallow it."""

    def __init__(self, per_rule: bool) -> None:
        super().__init__()
        self.per_rule = per_rule


#: what other evaluators of CEL (policies.py) catch when their budget runs out
OutOfSteps = _OutOfSteps


@dataclass
class StepMeter:
    remaining: int = OBJECT_STEP_BUDGET
    rule_limit: int = RULE_STEP_LIMIT
    rule_steps: int = 0

    def step(self) -> None:
        self.rule_steps += 1
        self.remaining -= 1
        if self.rule_steps > self.rule_limit:
            raise _OutOfSteps(per_rule=True)
        if self.remaining < 0:
            raise _OutOfSteps(per_rule=False)


class _MeteredEvaluator(Evaluator):
    """celpy's tree-walking interpreter, charging one step per AST node visited (macros included)."""

    def __init__(self, ast: Ast, activation: Any, meter: StepMeter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def _visit_tree(self, tree: Ast) -> Any:
        self.meter.step()
        return super()._visit_tree(tree)

    def sub_evaluator(self, ast: Ast) -> Evaluator:
        return _MeteredEvaluator(ast, self.activation, self.meter)


#: results of rule evaluations by (rule, the JSON of self and oldSelf): CEL is pure, and objects of
#: one kind mostly repeat the same values (every workload of a Deployment has one spec), while
#: cel-python's interpreter takes milliseconds for a rule of a few dozen nodes. A hit is charged
#: the steps the evaluation took, so budgets hold as if it ran.
_MEMO_SIZE: Final = 4096
_MEMO_VALUE_BYTES: Final = 8 * 1024
_memo: dict[tuple[int, bytes], tuple[CompiledRule, Any, int]] = {}


def _memo_key(value: Any, old: Any) -> bytes | None:
    """The values a rule sees, as bytes; None when they are too large to be worth remembering."""
    try:
        key = orjson.dumps([value, old], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return key if len(key) <= _MEMO_VALUE_BYTES else None


def evaluate_memoized(rule: CompiledRule, memo_key: bytes | None, variables: dict[str, Any],
                      meter: StepMeter) -> Any:
    """`evaluate(rule.ast, ...)`, answered from the memo when these values were seen before and the
    remaining budget covers what the evaluation cost then (otherwise it runs, to fail as it must)."""
    if memo_key is None:
        return evaluate(rule.ast, variables, meter)
    entry = _memo.get((id(rule), memo_key))
    if entry is not None and entry[0] is rule and entry[2] <= min(meter.remaining, meter.rule_limit):
        meter.rule_steps = entry[2]
        meter.remaining -= entry[2]
        if isinstance(entry[1], CELEvalError):
            raise entry[1].with_traceback(None)  # one stored error, raised afresh each time
        return entry[1]
    try:
        outcome = evaluate(rule.ast, variables, meter)
    except CELEvalError as exc:
        outcome = exc
    if len(_memo) >= _MEMO_SIZE:
        _memo.clear()
    _memo[(id(rule), memo_key)] = (rule, outcome, meter.rule_steps)
    if isinstance(outcome, CELEvalError):
        raise outcome
    return outcome


def _not_equal(a: Any, b: Any) -> Any:
    """`!=` as cel-go has it: anything but null differs from null (celpy finds no overload for a map or
    a list against null, which breaks the common `oldObject != null`)."""
    if (a is None) != (b is None):
        return _TRUE
    return bool_ne(a, b)


def _equal(a: Any, b: Any) -> Any:
    if (a is None) != (b is None):
        return _FALSE
    return bool_eq(a, b)


_NULL_AWARE: Final = {"_!=_": _not_equal, "_==_": _equal}


def evaluate(ast: Ast, variables: dict[str, Any], meter: StepMeter) -> Any:
    """Evaluate a compiled expression; raises CELEvalError for CEL errors, _OutOfSteps past the bound."""
    meter.rule_steps = 0
    activation = _env().program(ast, functions=_NULL_AWARE).new_activation()
    return _MeteredEvaluator(ast, activation, meter).evaluate(variables)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TRUE, _FALSE = celtypes.BoolType(True), celtypes.BoolType(False)


def to_cel(value: Any, schema: Schema | None) -> Any:
    """A JSON value as the CEL value kube builds for it from the schema.

    The celtypes constructors are bypassed for plain JSON values: they re-check and re-wrap every
    value and would make converting a large list cost more than evaluating a rule on it.
    """
    schema = schema or {}
    kind = schema.get("type")
    if value is None:
        return None
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        if kind == "number":
            return float.__new__(celtypes.DoubleType, value)
        return int.__new__(celtypes.IntType, value) if _INT64_MIN <= value <= _INT64_MAX else celtypes.IntType(value)
    if isinstance(value, float):
        if kind == "integer" and value.is_integer():
            return to_cel(int(value), schema)
        return float.__new__(celtypes.DoubleType, value)
    if isinstance(value, str):
        return str.__new__(celtypes.StringType, value)
    if isinstance(value, list):
        items = schema.get("items")
        item_schema = items if isinstance(items, dict) else None
        return celtypes.ListType([to_cel(item, item_schema) for item in value])
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        values_schema = additional if isinstance(additional, dict) else None
        converted = celtypes.MapType()
        dict.update(
            converted,
            {
                str.__new__(celtypes.StringType, key): to_cel(item, properties.get(key) or values_schema)
                for key, item in value.items()
            },
        )
        return converted
    return value


def validate(
    schema: Schema, obj: dict[str, Any], old: dict[str, Any] | None, meter: StepMeter | None = None
) -> list[Cause]:
    """Evaluate every rule of `schema` on the custom object `obj` (`old`: the stored object on update)."""
    rules = rules_for(schema)
    if rules is None:
        return []
    walk = _Walk(meter or StepMeter())
    try:
        walk.node(rules, _root_view(obj), _root_view(old) if old is not None else None, "")
    except _OutOfSteps:
        pass  # the message is already recorded; kube runs no further rules
    # kube's path of the object itself is a nil field.Path, which prints as "<nil>"
    return [(path or "<nil>", reason, message) for path, reason, message in walk.causes]


def _root_view(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    view = dict(obj)
    view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


class _Walk:
    def __init__(self, meter: StepMeter) -> None:
        self.meter = meter
        self.causes: list[Cause] = []

    def node(self, rules: RuleNode, value: Any, old: Any, path: str) -> None:
        if value is None:
            return
        if rules.rules:
            self.rules(rules, value, old, path)
        if isinstance(value, dict):
            old_map = old if isinstance(old, dict) else {}
            for name, child in rules.properties.items():
                if name in value:
                    self.node(child, value[name], old_map.get(name), _child(path, name))
            if rules.additional is not None and not rules.schema.get("properties"):
                for key, item in value.items():
                    self.node(rules.additional, item, old_map.get(key), f"{path}[{key}]")
        elif isinstance(value, list) and rules.items is not None:
            olds = _correlate_items(rules.schema, value, old)
            for i, item in enumerate(value):
                self.node(rules.items, item, olds[i], f"{path}[{i}]")

    def rules(self, rules: RuleNode, value: Any, old: Any, path: str) -> None:
        if self.meter.remaining <= 0:
            self.causes.append(_invalid(path, rules.schema, value, _BUDGET_MESSAGE))
            raise _OutOfSteps(per_rule=False)
        unchanged = old is not None and value == old
        self_value = to_cel(value, rules.schema)
        variables = {"self": self_value}
        if old is not None:
            variables["oldSelf"] = to_cel(old, rules.schema)
        memo_key = _memo_key(value, old)
        for rule in rules.rules:
            if rule.uses_old_self and old is None:
                continue
            if unchanged and not rule.uses_old_self:
                continue  # ratcheting: kube forgives an unchanged value (it only warns)
            self.rule(rule, rules.schema, value, variables, path, memo_key)

    def rule(self, rule: CompiledRule, schema: Schema, value: Any, variables: dict[str, Any], path: str,
             memo_key: bytes | None) -> None:
        try:
            result = evaluate_memoized(rule, memo_key, variables, self.meter)
        except _OutOfSteps as exc:
            if exc.per_rule:
                self.causes.append(
                    _invalid(
                        path,
                        schema,
                        value,
                        "'operation cancelled: actual cost limit exceeded': no further validation rules will be run "
                        f"due to call cost exceeds limit for rule: {rule.error_text}",
                    )
                )
            else:
                self.causes.append(_invalid(path, schema, value, _BUDGET_MESSAGE))
            raise
        except CELEvalError as exc:
            self.causes.append(_invalid(path, schema, value, _eval_error_text(exc, rule)))
            return
        if result is True or (isinstance(result, celtypes.BoolType) and bool(result)):
            return
        if not isinstance(result, (bool, celtypes.BoolType)):
            self.causes.append(_invalid(path, schema, value, f"rule did not evaluate to a bool: {rule.error_text}"))
            return
        target = _child(path, rule.field_path) if rule.field_path else path
        self.causes.append(self.failure(rule, schema, value, variables, target))

    def failure(self, rule: CompiledRule, schema: Schema, value: Any, variables: dict[str, Any], path: str) -> Cause:
        detail = self.message_expression(rule, variables) or rule.message or f"failed rule: {rule.text.strip()}"
        if rule.reason == "FieldValueForbidden":
            return forbidden(path, detail)
        if rule.reason == "FieldValueRequired":
            return required(path, detail)
        if rule.reason == "FieldValueDuplicate":
            return path, "FieldValueDuplicate", f"Duplicate value: {_shown(schema, value)}"
        return _invalid(path, schema, value, detail)

    def message_expression(self, rule: CompiledRule, variables: dict[str, Any]) -> str:
        """The messageExpression's text, or "" when it fails or is unusable (kube then uses the message)."""
        if rule.message_expression is None:
            return ""
        try:
            text = evaluate(rule.message_expression, variables, self.meter)
        except CELEvalError:
            return ""
        if not isinstance(text, str):
            return ""
        text = text.strip()
        if not text or "\n" in text or len(text) > _MESSAGE_EXPRESSION_MAX:
            return ""
        return str(text)


def _correlate_items(schema: Schema, value: list[Any], old: Any) -> list[Any]:
    """Old item for each new item: only `x-kubernetes-list-type: map` lists correlate, by their keys."""
    if not isinstance(old, list) or schema.get("x-kubernetes-list-type") != "map":
        return [None] * len(value)
    keys = schema.get("x-kubernetes-list-map-keys") or []

    def key_of(item: Any) -> tuple[Any, ...] | None:
        return tuple(orjson.dumps(item.get(k)) for k in keys) if isinstance(item, dict) else None

    by_key = {key_of(item): item for item in old if key_of(item) is not None}
    return [by_key.get(key_of(item)) for item in value]


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _shown(schema: Schema, value: Any) -> Any:
    """kube shows the schema type for objects and lists, the value itself for scalars."""
    if isinstance(value, (dict, list)):
        return str(schema.get("type") or ("object" if isinstance(value, dict) else "array"))
    return value


def _invalid(path: str, schema: Schema, value: Any, detail: str) -> Cause:
    return invalid_value(path, _shown(schema, value), detail)


_NO_SUCH_MEMBER = re.compile(r"no such member in mapping: '(.*)'")
#: celpy reports `error || error` and `error ? a : b` as overload failures naming the inner errors
_INNER_ERROR = re.compile(r"CELEvalError\(\*\((['\"])(.*?)\1, <class")


def _eval_error_text(exc: CELEvalError, rule: CompiledRule) -> str:
    """celpy's error in cel-go's words, as kube words an evaluation error of a rule."""
    text = str(exc.args[0]) if exc.args else str(exc)
    if text.startswith("found no matching overload"):
        details = exc.args[2] if len(exc.args) > 2 and isinstance(exc.args[2], tuple) else ()
        inner = _INNER_ERROR.search(" ".join(str(d) for d in details))
        if inner is None:
            return (
                "'no such overload': call arguments did not match a supported operator, function or macro "
                f"signature for rule: {rule.error_text}"
            )
        text = inner.group(2)
    match = _NO_SUCH_MEMBER.fullmatch(text)
    if match:
        text = f"no such key: {match.group(1)}"
    return f"{text} evaluating rule: {rule.error_text}"
