"""JSON for the framework's answers: Status, Reason, Suggestion and Explanation.

Why it exists: simulate-schedule, the extender, the scheduler's pod condition and `tfusion why -o json`
show the same explanation; the framework (tfusion/allocator/framework.py) is pure and renders no
JSON, so the one rendering lives here. Amounts are quantity strings in the unit of their resource
("8Gi", "20", "500m"); GPU and worker counts stay integers. Keys are camelCase like the rest of the
controller's JSON.
"""

from __future__ import annotations

from typing import Any

from tfusion.allocator.framework import Explanation, Reason, Status, Suggestion
from tfusion.allocator.units import tflops_str, vram_str


def amount_text(resource: str | None, value: int) -> str | int:
    """A Reason's amount in its resource's unit: quantity text for VRAM and TFLOPS, else the number."""
    name = resource or ""
    if "vram" in name:
        return vram_str(value)
    if "tflops" in name:
        return tflops_str(value)
    return value


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
