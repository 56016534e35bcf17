"""The one rendering of the framework's answers: Status, Reason, Suggestion and Explanation.

Why it exists: `/api/why` (and so `tfusion why`), simulate-schedule, the extender and the
scheduler's PodScheduled condition and FailedScheduling event all show the same explanation, and
two renderings had already drifted apart (one printed a 5000-TFLOPS request as 5000000, the other
as "5k"). The framework (tfusion/allocator/framework.py) is pure and renders no JSON, so the
JSON lives here, once. Amounts are canonical quantity strings in the unit of their resource
("80Gi", "5k", "500m": `tfusion.allocator.units.amount`); GPU, worker and pod counts stay
integers. The sentence with the numbers is `Reason.text()`, which formats through the same
function. Keys are camelCase like the rest of the controller's JSON.

The scheduler's and the extender's `Why` (what `/api/why` answers) and the PodScheduled condition
body are built here too, from the same Status renderings; unschedulable.py only decides when to
write them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from tfusion.allocator.framework import Code, Explanation, Reason, Status, Suggestion
from tfusion.allocator.units import amount
from tfusion.api.accessors import Pod, text
from tfusion.api.timestamps import rfc3339
from tfusion.controller.scheduling import nodes as nc


class ReasonBody(TypedDict):
    """One Reason as JSON; `requested`/`available` are canonical quantities ("5k"), counts integers."""

    message: str
    stage: str
    node: NotRequired[str]
    gpu: NotRequired[str]
    resource: NotRequired[str]
    requested: NotRequired[str | int]
    available: NotRequired[str | int]
    #: always there, and last (the sentence with the numbers)
    detail: NotRequired[str]


class StatusBody(TypedDict):
    code: str
    stage: str
    summary: str
    reasons: list[ReasonBody]


class SuggestionBody(TypedDict):
    kind: str
    message: str
    target: str
    changes: dict[str, str]
    pods: NotRequired[list[str]]
    node: NotRequired[str]


class PodCondition(TypedDict):
    """A pod condition as tfusion writes it (PodScheduled)."""

    type: str
    status: str
    reason: str
    message: str
    lastProbeTime: str | None
    lastTransitionTime: str


class ExplanationBody(TypedDict):
    message: str
    preFilter: StatusBody
    #: failing nodes only, by name
    nodes: dict[str, StatusBody]
    suggestions: NotRequired[list[SuggestionBody]]


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


def reason_json(reason: Reason) -> ReasonBody:
    out = ReasonBody(message=reason.message, stage=reason.stage)
    if reason.node is not None:
        out["node"] = reason.node
    if reason.gpu is not None:
        out["gpu"] = reason.gpu
    if reason.resource is not None:
        out["resource"] = reason.resource
    if reason.requested is not None:
        out["requested"] = amount_text(reason.resource, reason.requested)
    if reason.available is not None:
        out["available"] = amount_text(reason.resource, reason.available)
    out["detail"] = reason.text()
    return out


def status_json(status: Status) -> StatusBody:
    return {"code": str(status.code), "stage": status.stage, "summary": status.summary(),
            "reasons": [reason_json(r) for r in status.reasons]}


def suggestion_json(suggestion: Suggestion) -> SuggestionBody:
    out = SuggestionBody(kind=suggestion.kind, message=suggestion.message, target=suggestion.target,
                         changes=dict(suggestion.changes))
    if suggestion.pods:
        out["pods"] = list(suggestion.pods)
    if suggestion.node is not None:
        out["node"] = suggestion.node
    return out


def explanation_json(explanation: Explanation, total_nodes: int, *, suggestions: bool = True) -> ExplanationBody:
    """{message, preFilter, nodes (failing nodes only, by name), suggestions (unless left out)}."""
    out: ExplanationBody = {
        "message": explanation.message(total_nodes),
        "preFilter": status_json(explanation.pre_filter),
        "nodes": {name: status_json(s) for name, s in sorted(explanation.nodes.items()) if not s.ok},
    }
    if suggestions:
        out["suggestions"] = [suggestion_json(s) for s in explanation.suggestions]
    return out


@dataclass
class Why:
    """Why a pod is not placed: the kube-style message, each node's reasons, the suggestions."""

    namespace: str
    name: str
    uid: str
    message: str
    code: str
    nodes: dict[str, StatusBody] = field(default_factory=dict)
    suggestions: list[SuggestionBody] = field(default_factory=list)
    attempts: int = 0
    updated: str = ""


def why_of(pod: Pod, message: str, statuses: Mapping[str, Status], suggestions: Sequence[Suggestion],
           code: Code, *, pre_filter: Status | None = None) -> Why:
    """The pod's Why: the failing nodes' statuses (a PreFilter failure under the key "*") and the
    suggestions, rendered as `/api/why` shows them."""
    nodes = {n: status_json(s) for n, s in sorted(statuses.items()) if not s.ok}
    if pre_filter is not None and not pre_filter.ok:
        nodes = {"*": status_json(pre_filter), **nodes}
    return Why(pod.namespace or "default", pod.name, pod.uid, message, str(code), nodes,
               [suggestion_json(s) for s in suggestions], 0, rfc3339())


def why_text(pod: Pod, message: str, code: Code) -> Why:
    """A Why that is one sentence (a pod refused before any node is looked at)."""
    return why_of(pod, message, {}, [], code)


def node_suggestions(failures: Mapping[str, nc.NodeFailure], gpu_ok: Sequence[str]) -> list[Suggestion]:
    """Node-side changes that would let the pod onto a node its GPUs fit on: a toleration for the
    one taint that keeps it off, or less CPU/memory where only that is short."""
    out: list[Suggestion] = []
    for node in gpu_ok:
        failure = failures.get(node)
        if failure is None:
            continue
        if failure.check == "TaintToleration":
            taint = failure.message.split("taint ", 1)[-1]
            out.append(Suggestion("tolerate-taint", f"add a toleration for taint {taint}: the pod's GPUs "
                                  f"fit on node {node}", {}, target="pod", node=node))
        elif failure.resource in ("cpu", "memory"):
            most = amount(failure.resource, failure.available)
            out.append(Suggestion("smaller-request", f"request at most {most} {failure.resource}: it then fits on "
                                  f"node {node}", {}, target="pod", node=node))
        if len(out) >= 3:
            break
    return out


def unschedulable_condition(pod: Pod, message: str) -> PodCondition:
    """The PodScheduled=False condition kube-scheduler writes, keeping the transition time of one
    that already said False."""
    old = pod.condition("PodScheduled")
    since = text(old, "lastTransitionTime") if old is not None and old.get("status") == "False" else ""
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": None, "lastTransitionTime": since or rfc3339()}
