"""What the scheduler says about a pod it cannot place, built by explain.py from typed views: the
`/api/why` record (failing nodes only, a PreFilter failure under "*", suggestions rendered), the
node-side suggestions in canonical amounts, the PodScheduled condition that keeps its transition
time while it stays False, and the informer adapter that hands handlers views."""

from __future__ import annotations

from typing import Any

from tfusion.allocator.framework import SUCCESS, Code, Reason, Status, Suggestion
from tfusion.api.accessors import Node, Pod
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.explain import (
    node_failure_status,
    node_suggestions,
    status_json,
    unschedulable_condition,
    why_of,
    why_text,
)
from tfusion.controller.scheduling.scheduler import viewed

GIB = 1 << 30


def pod(conditions: list[dict[str, Any]] | None = None, namespace: str | None = "team") -> Pod:
    meta = {"name": "p", "uid": "u-1", **({"namespace": namespace} if namespace else {})}
    return Pod({"metadata": meta, "status": {"conditions": conditions or []}})


def test_the_why_record_keeps_failing_nodes_and_puts_a_prefilter_failure_first() -> None:
    short = nc.NodeFailure("Insufficient memory", "NodeResourcesFit", False, "memory", 5 * GIB, 4 * GIB)
    failing = node_failure_status(short, "node-b")
    quota = Status(Code.UNSCHEDULABLE, "PreFilter", (Reason("quota exceeded", "Quota"),))
    hint = Suggestion("smaller-request", "ask for less", {"tensor-fusion.ai/vram-request": "4Gi"})
    why = why_of(pod(), "0/2 nodes are available: 1 Insufficient memory.", {"node-a": SUCCESS, "node-b": failing},
                 [hint], Code.UNSCHEDULABLE, pre_filter=quota)
    assert (why.namespace, why.name, why.uid, why.code) == ("team", "p", "u-1", "Unschedulable")
    assert list(why.nodes) == ["*", "node-b"]
    assert why.nodes["node-b"] == status_json(failing)
    assert why.nodes["node-b"]["reasons"][0]["requested"] == "5Gi"
    assert why.suggestions == [{"kind": "smaller-request", "message": "ask for less", "target": "annotations",
                                "changes": {"tensor-fusion.ai/vram-request": "4Gi"}}]
    assert why.updated.endswith("Z")


def test_a_one_sentence_why_names_the_default_namespace() -> None:
    why = why_text(pod(namespace=None), "0/3 nodes are available: bad request.", Code.UNRESOLVABLE)
    assert (why.namespace, why.code, why.nodes, why.suggestions) == (
        "default", "UnschedulableAndUnresolvable", {}, [])


def test_node_suggestions_speak_in_canonical_amounts_and_stop_at_three() -> None:
    failures = {f"n{i}": nc.NodeFailure("Insufficient cpu", "NodeResourcesFit", False, "cpu", 2000, 600)
                for i in range(5)}
    failures["tainted"] = nc.NodeFailure("node(s) had untolerated taint {gpu: a100}", "TaintToleration", True)
    out = node_suggestions(failures, ["tainted", "n0", "n1", "n2", "n3", "elsewhere"])
    assert [s.kind for s in out] == ["tolerate-taint", "smaller-request", "smaller-request"]
    assert out[0].message.startswith("add a toleration for taint {gpu: a100}") and out[0].node == "tainted"
    assert out[1].message == "request at most 600m cpu: it then fits on node n0"


def test_the_condition_keeps_its_transition_time_only_while_it_stays_false() -> None:
    since = "2026-01-01T00:00:00Z"
    stays = unschedulable_condition(pod([{"type": "PodScheduled", "status": "False", "lastTransitionTime": since}]),
                                    "0/1 nodes are available.")
    assert stays == {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/1 nodes are available.", "lastProbeTime": None, "lastTransitionTime": since}
    flips = unschedulable_condition(pod([{"type": "PodScheduled", "status": "True", "lastTransitionTime": since}]),
                                    "0/1 nodes are available.")
    assert flips["lastTransitionTime"] != since and flips["lastTransitionTime"].endswith("Z")


def test_informer_handlers_get_views_and_an_absent_old_object_stays_none() -> None:
    seen: list[tuple[Node | None, Node]] = []
    handler = viewed(Node, lambda old, new: seen.append((old, new)))
    handler(None, {"metadata": {"name": "n1"}})
    handler({"metadata": {"name": "n1"}}, {"metadata": {"name": "n1", "labels": {"a": "b"}}})
    assert seen[0][0] is None and isinstance(seen[0][1], Node) and seen[0][1].name == "n1"
    assert isinstance(seen[1][0], Node) and seen[1][1].meta.labels == {"a": "b"}
