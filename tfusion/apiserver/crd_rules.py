"""CRD validation rules (`x-kubernetes-validations`, CEL) evaluated as kube-apiserver evaluates them.

The CEL engine (compiling, the metered evaluator, JSON to CEL values) is cel.py, shared with
ValidatingAdmissionPolicies; this module is what is particular to CRDs: compiling a schema's rules,
walking an object with its old self, ratcheting, and kube's messages.

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

Each rule evaluation is metered (cel.py's `StepMeter`): `RULE_STEP_LIMIT` steps per rule and
`OBJECT_STEP_BUDGET` for all rules of one object; running out gives kube's messages and stops
further rule evaluation for that object. Rules run only on objects that passed schema validation,
since they assume the schema's types.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from celpy import celtypes
from celpy.evaluation import CELEvalError

from tfusion.apiserver.cel import (
    OBJECT_STEP_BUDGET,
    RULE_STEP_LIMIT,
    Ast,
    CompileError,
    OutOfSteps,
    Schema,
    StepMeter,
    compile_expression,
    evaluate,
    to_cel,
)
from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

__all__ = ["OBJECT_STEP_BUDGET", "RULE_STEP_LIMIT", "CompiledRule", "RuleNode", "compile_schema", "crd_rule_causes",
           "rules_for", "validate"]

_CACHE_SIZE: Final = 128
_MESSAGE_EXPRESSION_MAX: Final = 5 * 1024
_REASONS: Final = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
_BUDGET_MESSAGE: Final = "validation failed due to running out of cost budget, no further validation rules will be run"


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


#: the same, by the schema object: a served schema is part of a stored CRD, never edited, and
#: hashing a workload's schema (tens of KB of JSON) on every write cost half as much as validating
#: the workload did
_by_schema: dict[int, tuple[Schema, RuleNode | None]] = {}


def rules_for(schema: Schema) -> RuleNode | None:
    """The compiled rules of a served schema (None if it has none), compiled once per distinct schema."""
    known = _by_schema.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    key = hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()
    if key in _compiled:
        _compiled.move_to_end(key)
        result = _compiled[key]
    else:
        node, _ = compile_schema(schema)
        result = None if node.empty() else node
        _compiled[key] = result
        if len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    if len(_by_schema) >= _CACHE_SIZE:
        _by_schema.clear()
    _by_schema[id(schema)] = (schema, result)  # the reference keeps the id from being reused
    return result


# ------------------------------------------------------------------------------ evaluating
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
    except OutOfSteps:
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
            raise OutOfSteps(per_rule=False)
        unchanged = old is not None and value == old
        # a transition rule runs only where an old value correlates; ratcheting: kube forgives an
        # unchanged value any other rule would refuse (it only warns), so none of those runs
        due = [rule for rule in rules.rules
               if (rule.uses_old_self and old is not None) or (not rule.uses_old_self and not unchanged)]
        if not due:
            return  # and the values are not converted for CEL: a status write leaves the spec as it was
        variables = {"self": to_cel(value, rules.schema)}
        if old is not None:
            variables["oldSelf"] = to_cel(old, rules.schema)
        memo_key = _memo_key(value, old)
        for rule in due:
            self.rule(rule, rules.schema, value, variables, path, memo_key)

    def rule(self, rule: CompiledRule, schema: Schema, value: Any, variables: dict[str, Any], path: str,
             memo_key: bytes | None) -> None:
        try:
            result = evaluate_memoized(rule, memo_key, variables, self.meter)
        except OutOfSteps as exc:
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
