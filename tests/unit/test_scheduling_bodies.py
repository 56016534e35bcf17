"""What the scheduler writes and reads at its edges, now that their signatures are typed: the
Binding body, the pod an event names, and quantities or requirement keys that are not what JSON
for them should be (the API server lets `spec.overhead` and node objects through unchecked)."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api.accessors import Node, Pod
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling.binder import binding_body
from tfusion.controller.scheduling.unschedulable import as_pod

POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
                       "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}


def test_binding_body_names_the_pod_and_carries_annotations() -> None:
    body = binding_body(Pod(POD), "node-a", {"tensor-fusion.ai/gpu-ids": "g1"})
    assert body == {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                                 "annotations": {"tensor-fusion.ai/gpu-ids": "g1"}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}


def test_binding_body_leaves_missing_fields_null_and_no_annotations_out() -> None:
    body = binding_body(Pod({"metadata": {"name": "p", "namespace": "ns"}}), "node-a", {})
    assert body["metadata"] == {"name": "p", "namespace": "ns", "uid": None}


def test_as_pod_adds_kind_for_events_and_keeps_the_object() -> None:
    shown = as_pod(Pod(POD))
    assert (shown.api_version, shown.kind, shown.name, shown.namespace) == ("v1", "Pod", "p", "ns")
    assert "kind" not in POD  # the cached object is not changed


@pytest.mark.parametrize("value", [["1"], {"cpu": "1"}, True, None])
def test_overhead_that_is_not_a_quantity_counts_as_nothing(value: object) -> None:
    pod = {**POD, "spec": {**POD["spec"], "overhead": {"cpu": value}}}
    assert nc.pod_requests(Pod(pod)) == (500, 0)


def test_overhead_numbers_count() -> None:
    pod = {**POD, "spec": {**POD["spec"], "overhead": {"cpu": 1}}}
    assert nc.pod_requests(Pod(pod)) == (1500, 0)


def test_a_requirement_key_that_is_not_a_string_matches_no_label() -> None:
    node = Node({"metadata": {"name": "n1", "labels": {"zone": "a"}}})
    assert not nc.term_matches({"matchExpressions": [{"key": 7, "operator": "Exists"}]}, node)
    assert nc.term_matches({"matchExpressions": [{"key": 7, "operator": "DoesNotExist"}]}, node)
    assert nc.term_matches({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, node)
