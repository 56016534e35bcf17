"""Validation of NetworkPolicy and PodDisruptionBudget, and the budget check of pods/eviction.

Why it exists: our install tree ships a NetworkPolicy and users bring PodDisruptionBudgets, so
the embedded API server stores both, refusing (422, field named) what kube-apiserver would
refuse. Nothing enforces network policies on the simulated node; budgets are honoured by
pods/eviction, which counts the Running and Ready pods a budget selects at the moment of the
eviction (with budgets.py, the arithmetic kube's disruption controller keeps in the budget's
status; here it is also computed when asked, and written to the status when an eviction reads it).
"""

from __future__ import annotations

import re
from typing import Any

from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.apiserver import errors
from tfusion.apiserver.validation import Cause, invalid_value, required

NETWORK_POLICIES = "networking.k8s.io/networkpolicies"
PDBS = "policy/poddisruptionbudgets"
POLICY_KEYS = (NETWORK_POLICIES, PDBS)

_POLICY_TYPES = ("Ingress", "Egress")
_PERCENT = re.compile(r"[0-9]+%")
_PERCENT_MSG = "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%' or '93%')"
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def _selector_causes(field: str, selector: Any) -> list[Cause]:
    if selector is None:
        return [required(field)]
    try:
        label_selector_from_dict(selector, field=field)
    except SelectorError as exc:
        return [invalid_value(field, selector, str(exc))]
    return []


def validate_network_policy(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec.podSelector")]
    causes = _selector_causes("spec.podSelector", spec.get("podSelector"))
    types = spec.get("policyTypes") or []
    if not isinstance(types, list):
        return [*causes, invalid_value("spec.policyTypes", types, "must be a list")]
    for index, value in enumerate(types):
        if value not in _POLICY_TYPES:
            supported = ", ".join(f'"{t}"' for t in _POLICY_TYPES)
            causes.append((f"spec.policyTypes[{index}]", "FieldValueNotSupported",
                           f'Unsupported value: "{value}": supported values: {supported}'))
    return causes


def _int_or_percent(field: str, value: Any) -> list[Cause]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [invalid_value(field, value, "must be greater than or equal to 0")] if value < 0 else []
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        return [invalid_value(field, value, "must not be greater than 100%")] if int(value[:-1]) > 100 else []
    return [invalid_value(field, value, _PERCENT_MSG)]


def validate_pdb(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec.selector")]
    causes = _selector_causes("spec.selector", spec.get("selector"))
    given = [key for key in ("minAvailable", "maxUnavailable") if spec.get(key) is not None]
    if len(given) == 2:
        causes.append(invalid_value("spec", "", "minAvailable and maxUnavailable cannot be both set"))
    elif not given:
        causes.append(required("spec.minAvailable", "one of minAvailable or maxUnavailable must be set"))
    for key in given:
        causes += _int_or_percent(f"spec.{key}", spec[key])
    return causes


def validate(storage_key: str, obj: dict[str, Any]) -> list[Cause]:
    if storage_key == NETWORK_POLICIES:
        return validate_network_policy(obj)
    if storage_key == PDBS:
        return validate_pdb(obj)
    return []


# ------------------------------------------------------------------------------------ budgets
def healthy(pod: dict[str, Any]) -> bool:
    """Running, Ready and not being deleted: what a budget counts."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    try:
        compiled = label_selector_from_dict(selector, field="spec.selector")
    except SelectorError:
        return False
    return not compiled.empty and compiled.matches((pod.get("metadata") or {}).get("labels") or {})


def refuse(pdb_name: str, status: dict[str, Any]) -> errors.ApiError:
    """kube's 429 for an eviction a budget forbids, the budget named in the cause."""
    why = (f"The disruption budget {pdb_name} needs {status['desiredHealthy']} healthy pods and has "
           f"{status['currentHealthy']} currently")
    details = {"causes": [{"reason": "DisruptionBudget", "message": why}]}
    return errors.ApiError(429, "TooManyRequests", VIOLATION, details=details)


# ------------------------------------------------------------------------------------ tables
def _or_na(key: str) -> Any:
    return lambda obj: str((obj.get("spec") or {}).get(key, "N/A"))


def _pod_selector(obj: dict[str, Any]) -> str:
    from tfusion.apiserver.apps import format_selector

    return format_selector((obj.get("spec") or {}).get("podSelector"))


def _shorten(items: list[str]) -> str:
    """kube prints at most three endpoints, then how many more."""
    if not items:
        return "<none>"
    shown = ",".join(items[:3])
    return shown + (f" + {len(items) - 3} more..." if len(items) > 3 else "")


def _endpoints(obj: dict[str, Any]) -> str:
    pairs = [f"{a.get('ip')}:{p.get('port')}" for s in obj.get("subsets") or []
             for a in s.get("addresses") or [] for p in s.get("ports") or [{}]]
    return _shorten(pairs)


def _slice_ports(obj: dict[str, Any]) -> str:
    return ",".join(str(p.get("port")) for p in obj.get("ports") or []) or "<unset>"


def _slice_endpoints(obj: dict[str, Any]) -> str:
    return _shorten([str(a) for e in obj.get("endpoints") or [] for a in e.get("addresses") or []])


def table_columns(name: Any, age: Any) -> dict[str, list[Any]]:
    """`kubectl get` columns of these kinds, as kube prints them (tables.py merges them in)."""
    return {
        PDBS: [name, ("Min Available", "string", "spec.minAvailable", _or_na("minAvailable")),
               ("Max Unavailable", "string", "spec.maxUnavailable", _or_na("maxUnavailable")),
               ("Allowed Disruptions", "integer", "status.disruptionsAllowed",
                lambda o: int((o.get("status") or {}).get("disruptionsAllowed") or 0)), age],
        NETWORK_POLICIES: [name, ("Pod-Selector", "string", "spec.podSelector", _pod_selector), age],
        "/endpoints": [name, ("Endpoints", "string", "the ready addresses", _endpoints), age],
        "discovery.k8s.io/endpointslices": [
            name, ("AddressType", "string", "address type", lambda o: o.get("addressType")),
            ("Ports", "string", "ports", _slice_ports), ("Endpoints", "string", "addresses", _slice_endpoints), age],
    }
