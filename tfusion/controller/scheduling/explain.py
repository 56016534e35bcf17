"""The one rendering of the framework's answers: Status, Reason, Suggestion and Explanation.

Why it exists: `/api/why` (and so `tfusion why`), simulate-schedule, the extender and the
scheduler's PodScheduled condition and FailedScheduling event all show the same explanation, and
two renderings had already drifted apart (one printed a 5000-TFLOPS request as 5000000, the other
as "5k"). The framework (tfusion/allocator/framework.py) is pure and renders no JSON, so the
JSON lives here, once. Amounts are canonical quantity strings in the unit of their resource
("80Gi", "5k", "500m": `tfusion.allocator.units.amount`); GPU, worker and pod counts stay
integers. The sentence with the numbers is `Reason.text()`, which formats through the same
function. Keys are camelCase like the rest of the controller's JSON.
"""

from __future__ import annotations

from typing import Any

from tfusion.allocator.framework import Code, Explanation, Reason, Status, Suggestion
from tfusion.allocator.units import amount
from tfusion.controller.scheduling import nodes as nc


def amount_text(resource: str | None, value: int) -> str | int:
    """A Reason's amount in its resource's unit (see `tfusion.allocator.units.amount`)."""
    return amount(resource, value)


def node_failure_status(failure: nc.NodeFailure, node: str) -> Status:
    """A node check's "no" as the framework's Status, so that it renders like the GPU reasons."""
    code = Code.UNRESOLVABLE if failure.unresolvable else Code.UNSCHEDULABLE
    detail = failure.message
    if failure.resource:
        detail = (f"{failure.message}: requested {amount(failure.resource, failure.requested)}, "
                  f"available {amount(failure.resource, failure.available)}")
    reason = Reason(failure.message, failure.check, node=node, resource=failure.resource or None,
                    requested=failure.requested if failure.resource else None,
                    available=failure.available if failure.resource else None, detail=detail)
    return Status(code, "Filter", (reason,))


def reason_json(reason: Reason) -> dict[str, Any]:
    out: dict[str, Any] = {"message": reason.message, "stage": reason.stage}
    for key in ("node", "gpu", "resource"):
        value = getattr(reason, key)
        if value is not None:
            out[key] = value
    if reason.requested is not None:
        out["requested"] = amount_text(reason.resource, reason.requested)
    if reason.available is not None:
        out["available"] = amount_text(reason.resource, reason.available)
    out["detail"] = reason.text()
    return out


def status_json(status: Status) -> dict[str, Any]:
    return {"code": str(status.code), "stage": status.stage, "summary": status.summary(),
            "reasons": [reason_json(r) for r in status.reasons]}


def suggestion_json(suggestion: Suggestion) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": suggestion.kind, "message": suggestion.message, "target": suggestion.target,
                           "changes": dict(suggestion.changes)}
    if suggestion.pods:
        out["pods"] = list(suggestion.pods)
    if suggestion.node is not None:
        out["node"] = suggestion.node
    return out


def explanation_json(explanation: Explanation, total_nodes: int, *, suggestions: bool = True) -> dict[str, Any]:
    """{message, preFilter, nodes (failing nodes only, by name), suggestions (unless left out)}."""
    out: dict[str, Any] = {
        "message": explanation.message(total_nodes),
        "preFilter": status_json(explanation.pre_filter),
        "nodes": {name: status_json(s) for name, s in sorted(explanation.nodes.items()) if not s.ok},
    }
    if suggestions:
        out["suggestions"] = [suggestion_json(s) for s in explanation.suggestions]
    return out
