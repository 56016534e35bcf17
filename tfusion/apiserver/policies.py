"""ValidatingAdmissionPolicy: CEL checks on writes, declared as objects and enforced in the server.

Why it exists: RBAC can say that the hypervisor may patch GPUs, not which ones. deploy/ ships a
ValidatingAdmissionPolicy that holds each hypervisor to its own node's GPUs and GPUNode (the node
name comes from its bound ServiceAccount token, tokens.py), and the embedded API server must enforce
the same object, or `--role=all` would grant more than a cluster does.

How a write is judged (`admit`, called by objects.py after mutating admission and the kind's own
validation, before the store write): for every ValidatingAdmissionPolicyBinding (by name) whose
policy exists, the request must match the policy's `matchConstraints` and the binding's
`matchResources` (resourceRules with operations, apiGroups, apiVersions, resources incl. `x/status`,
resourceNames and scope; excludeResourceRules; namespaceSelector; objectSelector) and every
`matchConditions` expression; then `variables` are computed in order and every `validations`
expression must be true. A false one under the binding's `Deny` action refuses the request with the
validation's reason (Invalid, 422, unless it names another) and says which policy and binding refused
it; `Warn` and `Audit` are logged. An expression that fails to evaluate follows the policy's
`failurePolicy` (Fail refuses, Ignore skips the policy). Expressions see `object`, `oldObject`
(null on create, resp. delete), `request` (kind, resource, subResource, name, namespace, operation,
userInfo with username, groups and extra, dryRun, options), `namespaceObject`, `params` (always
null) and `variables`. Writes of admission configuration (admissionregistration.k8s.io) are
exempt, as in kube, so that no policy can lock itself in.

Policies and bindings are checked when written (`validate`): an expression that does not compile,
an unknown operation, reason or action is a 422 naming the field. Not supported, and refused as such:
`paramKind` and `paramRef`, and the `authorizer` variable. Variables are computed eagerly, so one
that fails makes its policy fail even where no validation reads it. CEL work is bounded as for CRD
rules (cel.py): one step budget per request across all its policies, and expressions nested deeper
than the interpreter's stack allows are refused when written; the CEL text of one policy is bounded
too, since it is parsed on the event loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from celpy import celtypes
from celpy.evaluation import CELEvalError

from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.apiserver import cel, errors
from tfusion.apiserver.admission import AdmissionAttributes, build_admission_review, webhook_matches
from tfusion.apiserver.kinds import NAMESPACES
from tfusion.apiserver.rbac import CURRENT_USER
from tfusion.apiserver.resources import ResourceInfo
from tfusion.apiserver.store import Entry, Store
from tfusion.apiserver.validation import Cause, forbidden, invalid_value, required

__all__ = ["BINDINGS", "KEYS", "POLICIES", "admit", "validate"]

log = logging.getLogger(__name__)

POLICIES: Final = "admissionregistration.k8s.io/validatingadmissionpolicies"
BINDINGS: Final = "admissionregistration.k8s.io/validatingadmissionpolicybindings"
KEYS: Final = frozenset({POLICIES, BINDINGS})
#: what a policy's expressions may read
DECLARED: Final = frozenset({"object", "oldObject", "request", "params", "namespaceObject", "variables"})
_OPERATIONS: Final = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")
_REASONS: Final = {"Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413, "Unauthorized": 401}
_ACTIONS: Final = ("Audit", "Deny", "Warn")
_SCOPES: Final = ("*", "Cluster", "Namespaced")
_VARIABLE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a binding without resourceRules of its own narrows nothing: it matches every resource
_EVERYTHING: Final = [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*", "*/*"]}]
_CACHE_SIZE: Final = 256
_ADMISSION_GROUP: Final = "admissionregistration.k8s.io"
#: all CEL text of one policy: parsing is linear but slow (about 0.6 s for 80 KB) and runs on the
#: event loop, so it is bounded before anything is parsed
MAX_EXPRESSION_CHARS: Final = 64 * 1024


# ------------------------------------------------------------------------------ checking the objects
def validate(storage_key: str, obj: Mapping[str, Any]) -> list[Cause]:
    """Why a ValidatingAdmissionPolicy or a binding of one cannot be stored (nothing: it can)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [required("spec")]
    if storage_key == POLICIES:
        return _validate_policy(spec)
    return _validate_binding(spec)


def _validate_policy(spec: Mapping[str, Any]) -> list[Cause]:
    total = sum(len(text) for text in _expression_texts(spec))
    if total > MAX_EXPRESSION_CHARS:
        return [("spec", "FieldValueTooLong",
                 f"Too long: the CEL expressions of a policy may hold {MAX_EXPRESSION_CHARS} characters in all, "
                 f"these hold {total}")]
    causes = _one_of(spec.get("failurePolicy"), "spec.failurePolicy", ("Fail", "Ignore"), optional=True)
    if spec.get("paramKind") is not None:
        causes.append(forbidden("spec.paramKind", "parameter resources are not supported by this API server"))
    causes += _validate_match(spec.get("matchConstraints"), "spec.matchConstraints", rules_required=True)
    causes += _validate_named(spec.get("matchConditions"), "spec.matchConditions", "expression")
    causes += _validate_named(spec.get("variables"), "spec.variables", "expression", identifier=True)
    validations, audits = spec.get("validations"), spec.get("auditAnnotations")
    for index, item in enumerate(_items(validations, "spec.validations", causes)):
        where = f"spec.validations[{index}]"
        causes += _compile_causes(item.get("expression"), f"{where}.expression")
        if item.get("messageExpression") is not None:
            causes += _compile_causes(item.get("messageExpression"), f"{where}.messageExpression")
        message = item.get("message")
        if message is not None and (not isinstance(message, str) or "\n" in message):
            causes.append(invalid_value(f"{where}.message", message, "must be a single line of text"))
        causes += _one_of(item.get("reason"), f"{where}.reason", tuple(_REASONS), optional=True)
    for index, item in enumerate(_items(audits, "spec.auditAnnotations", causes)):
        if not isinstance(item.get("key"), str) or not item["key"]:
            causes.append(required(f"spec.auditAnnotations[{index}].key"))
        causes += _compile_causes(item.get("valueExpression"), f"spec.auditAnnotations[{index}].valueExpression")
    if not validations and not audits:
        causes.append(required("spec.validations", "validations or auditAnnotations must contain at least one item"))
    return causes


def _expression_texts(spec: Mapping[str, Any]) -> list[str]:
    found = []
    for field, keys in (("matchConditions", ("expression",)), ("variables", ("expression",)),
                        ("validations", ("expression", "messageExpression")),
                        ("auditAnnotations", ("valueExpression",))):
        items = spec.get(field)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping):
                found += [item[k] for k in keys if isinstance(item.get(k), str)]
    return found


def _validate_binding(spec: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    if not isinstance(spec.get("policyName"), str) or not spec["policyName"]:
        causes.append(required("spec.policyName"))
    if spec.get("paramRef") is not None:
        causes.append(forbidden("spec.paramRef", "parameter resources are not supported by this API server"))
    actions = spec.get("validationActions")
    if not isinstance(actions, list) or not actions:
        causes.append(required("spec.validationActions", 'one or more of "Audit", "Deny", "Warn"'))
    else:
        for index, action in enumerate(actions):
            causes += _one_of(action, f"spec.validationActions[{index}]", _ACTIONS)
            if action in actions[:index]:
                causes.append(("spec.validationActions", "FieldValueDuplicate", f"Duplicate value: {action!r}"))
        if "Deny" in actions and "Warn" in actions:
            causes.append(invalid_value("spec.validationActions", actions,
                                        "Deny and Warn together would warn about a request that is refused anyway"))
    if spec.get("matchResources") is not None:
        causes += _validate_match(spec["matchResources"], "spec.matchResources", rules_required=False)
    return causes


def _validate_match(match: Any, path: str, *, rules_required: bool) -> list[Cause]:
    if not isinstance(match, Mapping):
        return [required(path)] if rules_required or match is not None else []
    causes = _one_of(match.get("matchPolicy"), f"{path}.matchPolicy", ("Equivalent", "Exact"), optional=True)
    for field in ("namespaceSelector", "objectSelector"):
        try:
            label_selector_from_dict(match.get(field) or {}, field=f"{path}.{field}")
        except SelectorError as exc:
            causes.append(invalid_value(f"{path}.{field}", match.get(field), str(exc)))
    rules = match.get("resourceRules")
    if rules_required and not rules:
        causes.append(required(f"{path}.resourceRules", "a policy must say which resources it judges"))
    for field in ("resourceRules", "excludeResourceRules"):
        for index, rule in enumerate(_items(match.get(field), f"{path}.{field}", causes)):
            causes += _validate_rule(rule, f"{path}.{field}[{index}]")
    return causes


def _validate_rule(rule: Mapping[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for field in ("operations", "apiGroups", "apiVersions", "resources"):
        values = rule.get(field)
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            causes.append(required(f"{path}.{field}", "a non-empty list of strings"))
    for index, operation in enumerate(rule.get("operations") or []):
        causes += _one_of(operation, f"{path}.operations[{index}]", _OPERATIONS)
    names = rule.get("resourceNames")
    if names is not None and (not isinstance(names, list) or not all(isinstance(v, str) for v in names)):
        causes.append(invalid_value(f"{path}.resourceNames", names, "must be a list of object names"))
    return causes + _one_of(rule.get("scope"), f"{path}.scope", _SCOPES, optional=True)


def _validate_named(items: Any, path: str, field: str, *, identifier: bool = False) -> list[Cause]:
    causes: list[Cause] = []
    seen: set[str] = set()
    for index, item in enumerate(_items(items, path, causes)):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            causes.append(required(f"{path}[{index}].name"))
        elif name in seen:
            causes.append((f"{path}[{index}].name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        elif identifier and not _VARIABLE_NAME.fullmatch(name):
            causes.append(invalid_value(f"{path}[{index}].name", name,
                                        "must be a CEL identifier ([A-Za-z_][A-Za-z0-9_]*)"))
        if isinstance(name, str):
            seen.add(name)
        causes += _compile_causes(item.get(field), f"{path}[{index}].{field}")
    return causes


def _items(value: Any, path: str, causes: list[Cause]) -> list[Mapping[str, Any]]:
    """The objects of a list field; a non-list or a non-object item is recorded as a cause."""
    if value is None:
        return []
    if not isinstance(value, list):
        causes.append(invalid_value(path, value, "must be a list"))
        return []
    found = []
    for index, item in enumerate(value):
        if isinstance(item, Mapping):
            found.append(item)
        else:
            causes.append(invalid_value(f"{path}[{index}]", item, "must be an object"))
    return found


def _one_of(value: Any, path: str, allowed: tuple[str, ...], *, optional: bool = False) -> list[Cause]:
    if (value is None and optional) or value in allowed:
        return []
    supported = ", ".join(f'"{a}"' for a in allowed)
    return [(path, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {supported}')]


def _compile_causes(text: Any, path: str) -> list[Cause]:
    if not isinstance(text, str) or not text.strip():
        return [required(path)]
    try:
        _compile(text)
    except cel.CompileError as exc:
        return [invalid_value(path, text, f"compilation failed: {exc}")]
    return []


def _compile(text: str) -> cel.Ast:
    try:
        return cel.compile_expression(text, DECLARED)[0]
    except cel.CompileError as exc:
        if "'authorizer'" in str(exc):
            raise cel.CompileError(f"{exc}; the authorizer variable is not offered by this API server") from None
        raise


# ------------------------------------------------------------------------------ compiled policies
@dataclass(frozen=True)
class _Check:
    text: str
    ast: cel.Ast
    message: str = ""
    message_expression: cel.Ast | None = None
    reason: str = "Invalid"


@dataclass(frozen=True)
class _Policy:
    name: str
    fail_closed: bool
    match: Mapping[str, Any]
    conditions: tuple[tuple[str, _Check], ...]
    variables: tuple[tuple[str, _Check], ...]
    validations: tuple[_Check, ...]


_compiled: dict[tuple[str, int], _Policy] = {}


def _policy(entry: Entry) -> _Policy:
    """The compiled form of a stored policy, compiled once per version of it."""
    key = (str(entry.obj["metadata"].get("uid", "")), entry.rv)
    found = _compiled.get(key)
    if found is not None:
        return found
    spec = entry.obj.get("spec") or {}

    def named(field: str) -> tuple[tuple[str, _Check], ...]:
        return tuple((str(i["name"]), _Check(i["expression"], _compile(i["expression"])))
                     for i in spec.get(field) or [])

    validations = tuple(
        _Check(v["expression"], _compile(v["expression"]), str(v.get("message") or ""),
               _compile(v["messageExpression"]) if v.get("messageExpression") else None, v.get("reason") or "Invalid")
        for v in spec.get("validations") or [])
    policy = _Policy(entry.obj["metadata"]["name"], spec.get("failurePolicy") != "Ignore",
                     spec.get("matchConstraints") or {}, named("matchConditions"), named("variables"), validations)
    if len(_compiled) >= _CACHE_SIZE:
        _compiled.clear()
    _compiled[key] = policy
    return policy


# ------------------------------------------------------------------------------ judging a write
class _Refused(Exception):
    """A policy says no (or failed under failurePolicy Fail): the reason and what to tell the client."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class _Broken(Exception):
    """An expression could not be evaluated."""


def admit(store: Store, operation: str, info: ResourceInfo, subresource: str, obj: dict[str, Any] | None,
          old: dict[str, Any] | None, *, dry_run: bool) -> None:
    """Judge one write by every bound policy; raises the ApiError of the first binding that denies it.

    Admission configuration itself is exempt, as in kube: a policy refusing everything can still be
    unbound."""
    if store.count(BINDINGS) == 0 or info.group == _ADMISSION_GROUP:
        return
    attrs = _attributes(operation, info, subresource, obj, old, dry_run)
    labels = _namespace_labels(store, attrs)
    request: _Request | None = None
    for _, binding in sorted(store.items(BINDINGS), key=lambda item: item[0]):
        spec = binding.obj.get("spec") or {}
        entry = store.get(POLICIES, "", str(spec.get("policyName") or ""))
        if entry is None:
            continue  # kube ignores a binding whose policy does not exist (yet)
        policy = _policy(entry)
        if not _matches(policy.match, attrs, labels, policy.name) or (
                spec.get("matchResources") is not None
                and not _matches(spec["matchResources"], attrs, labels, binding.obj["metadata"]["name"])):
            continue
        request = request or _Request(store, attrs)
        try:
            _judge(policy, request)
        except _Refused as refusal:
            _act(policy.name, binding.obj["metadata"]["name"], spec.get("validationActions") or [], refusal)


def _attributes(operation: str, info: ResourceInfo, subresource: str, obj: dict[str, Any] | None,
                old: dict[str, Any] | None, dry_run: bool) -> AdmissionAttributes:
    meta = (obj if obj is not None else old or {}).get("metadata") or {}
    user = CURRENT_USER.get().as_dict()
    return AdmissionAttributes(
        operation=operation, group=info.group, version=info.version, resource=info.plural, subresource=subresource,
        kind={"group": info.group, "version": info.version, "kind": info.kind},
        namespace=str(meta.get("namespace") or "") if info.namespaced else "", name=str(meta.get("name") or ""),
        obj=obj, old_obj=old, user_info=user, dry_run=dry_run,
        options={"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
    )


def _namespace_labels(store: Store, attrs: AdmissionAttributes) -> dict[str, str]:
    if not attrs.namespace:
        return {}
    entry = store.get(NAMESPACES, "", attrs.namespace)
    return dict((entry.obj["metadata"].get("labels") or {}) if entry else {})


def _matches(match: Mapping[str, Any], attrs: AdmissionAttributes, labels: Mapping[str, str], name: str) -> bool:
    """Whether the request is among the resources `match` (matchConstraints or matchResources) selects."""
    rules = [r for r in match.get("resourceRules") or _EVERYTHING
             if not r.get("resourceNames") or attrs.name in r["resourceNames"]]
    selectors = {"name": name, "objectSelector": match.get("objectSelector"),
                 "namespaceSelector": match.get("namespaceSelector")}
    if not webhook_matches({**selectors, "rules": rules}, attrs, labels):
        return False
    excluded = [r for r in match.get("excludeResourceRules") or []
                if not r.get("resourceNames") or attrs.name in r["resourceNames"]]
    return not (excluded and webhook_matches({"name": name, "rules": excluded}, attrs, labels))


class _Request:
    """The CEL values of one request, converted once however many policies read them."""

    def __init__(self, store: Store, attrs: AdmissionAttributes) -> None:
        request = build_admission_review(attrs)["request"]
        request.pop("object", None)
        request.pop("oldObject", None)
        request.setdefault("name", "")
        request.setdefault("namespace", "")
        namespace = store.get(NAMESPACES, "", attrs.namespace) if attrs.namespace else None
        self.variables: dict[str, Any] = {
            "object": cel.to_cel(attrs.obj, None), "oldObject": cel.to_cel(attrs.old_obj, None),
            "request": cel.to_cel(request, None), "params": None,
            "namespaceObject": cel.to_cel(namespace.obj, None) if namespace else None,
        }
        #: one budget for every expression of every policy this request meets
        self.meter = cel.StepMeter()


def _judge(policy: _Policy, request: _Request) -> None:
    """Raise _Refused when `policy` refuses the request; return when it allows it or does not apply."""
    try:
        if not _conditions_hold(policy, request):
            return
        computed = celtypes.MapType()
        activation = {**request.variables, "variables": computed}
        for name, check in policy.variables:
            computed[celtypes.StringType(name)] = _evaluate(check, activation, request, f"variable '{name}'")
    except _Broken as exc:
        if policy.fail_closed:
            raise _Refused("Forbidden", str(exc)) from None
        return
    for check in policy.validations:
        try:
            result = _evaluate(check, activation, request, f"expression '{check.text.strip()}'")
        except _Broken as exc:
            if policy.fail_closed:
                raise _Refused(check.reason, str(exc)) from None
            return
        if not isinstance(result, celtypes.BoolType):
            if policy.fail_closed:
                raise _Refused(check.reason, f"expression '{check.text.strip()}' gave {type(result).__name__}, "
                                             "not a bool")
            return
        if not result:
            raise _Refused(check.reason, _message(check, activation, request))


def _conditions_hold(policy: _Policy, request: _Request) -> bool:
    """All matchConditions true: True; one false: False (the policy does not apply); else _Broken."""
    broken: _Broken | None = None
    activation = {**request.variables, "variables": celtypes.MapType()}
    for name, check in policy.conditions:
        try:
            value = _evaluate(check, activation, request, f"match condition '{name}'")
        except _Broken as exc:
            broken = broken or exc
            continue
        if not isinstance(value, celtypes.BoolType):
            broken = broken or _Broken(f"match condition '{name}' gave {type(value).__name__}, not a bool")
        elif not value:
            return False
    if broken is not None:
        raise broken
    return True


def _evaluate(check: _Check, activation: dict[str, Any], request: _Request, what: str) -> Any:
    try:
        return cel.evaluate(check.ast, activation, request.meter)
    except CELEvalError as exc:
        detail = str(exc.args[0]) if exc.args else str(exc)
        raise _Broken(f"{what} could not be evaluated: {detail}") from None
    except cel.OutOfSteps:
        raise _Broken(f"{what} ran out of its CEL cost budget") from None
    except RecursionError:  # compiling bounds the depth; this is the last line of defence
        raise _Broken(f"{what} nests too deeply to evaluate") from None


def _message(check: _Check, activation: dict[str, Any], request: _Request) -> str:
    """messageExpression's single line of text if it gives one, else message, else the expression."""
    if check.message_expression is not None:
        try:
            text = cel.evaluate(check.message_expression, activation, request.meter)
        except (CELEvalError, cel.OutOfSteps):
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return str(text).strip()
    return check.message or f"failed expression: {check.text.strip()}"


def _act(policy: str, binding: str, actions: list[Any], refusal: _Refused) -> None:
    message = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {refusal.message}"
    if "Deny" in actions:
        raise errors.ApiError(_REASONS.get(refusal.reason, 422), refusal.reason, message)
    if "Warn" in actions or "Audit" in actions:
        log.warning("%s (binding action %s: the request goes ahead)", message, "/".join(str(a) for a in actions))
