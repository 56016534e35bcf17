"""Does a core/v1 NodeSelector select a Node? (the rules of k8s.io/component-helpers nodeaffinity)

Terms are ORed, the requirements of one term ANDed; an empty term selects nothing, an empty or
absent selector everything. Operators: In, NotIn, Exists, DoesNotExist, Gt, Lt (integers) on
labels; `matchFields` knows `metadata.name` (In/NotIn), as kube-scheduler does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def node_selector_matches(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    if not selector:
        return True
    terms = selector.get("nodeSelectorTerms") or []
    return any(_term_matches(term, node) for term in terms)


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    field_values = {"metadata.name": str(meta.get("name", ""))}
    return (all(_requirement_matches(e, labels) for e in expressions)
            and all(_requirement_matches(f, field_values) for f in fields))


def _requirement_matches(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key = requirement.get("key", "")
    operator = requirement.get("operator", "")
    wanted = [str(v) for v in requirement.get("values") or []]
    present = key in values
    value = values.get(key, "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(wanted) != 1:
            return False
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator selects nothing
