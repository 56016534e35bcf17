"""The typed views: what a field reads as when it is there, missing, or of the wrong JSON type."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Meta, Pod, items, section, text

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": 3, "resourceVersion": "7",
                 "labels": {tfa.COMPONENT: "worker", "odd": 5}, "annotations": {tfa.GPU_IDS: "gpu-1"},
                 "finalizers": [tfa.FINALIZER, 7],
                 "ownerReferences": [{"kind": "X", "uid": "o1"}, {"kind": "Y", "uid": "o2", "controller": True}]},
    "spec": {"nodeName": "n1", "containers": [{"name": "main"}, "junk"], "schedulingGates": [{"name": "g"}, {}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, 3]},
}


def test_fields_read_as_written() -> None:
    pod = Pod(POD)
    assert (pod.name, pod.namespace, pod.uid, pod.key) == ("p", "ns", "u1", ("ns", "p"))
    assert (pod.meta.generation, pod.meta.resource_version) == (3, "7")
    assert pod.meta.labels == {tfa.COMPONENT: "worker"}  # a non-string value is not a label
    assert pod.meta.finalizers == [tfa.FINALIZER]
    assert pod.meta.controller_ref() == {"kind": "Y", "uid": "o2", "controller": True}
    assert [c["name"] for c in pod.containers] == ["main"]
    assert pod.scheduling_gates == ["g"]
    assert pod.condition("Ready") == {"type": "Ready", "status": "True"}
    assert (pod.node_name, pod.phase, pod.finished) == ("n1", "Running", False)
    assert pod.is_worker and pod.holds_gpus


@pytest.mark.parametrize("wrong", [None, [], "text", 5, True])
def test_a_wrong_type_anywhere_reads_as_absent(wrong: object) -> None:
    obj: dict[str, Any] = {"metadata": wrong, "spec": {"nodeName": wrong, "containers": wrong}, "status": wrong}
    pod = Pod(obj)
    assert (pod.name, pod.meta.labels, pod.meta.finalizers, pod.meta.owner_references) == ("", {}, [], [])
    assert pod.node_name == ("text" if wrong == "text" else "")
    assert (pod.containers, pod.conditions, pod.phase, pod.finished, pod.holds_gpus) == ([], [], "", False, False)
    assert pod.meta.annotation(tfa.GPU_IDS) is None and not pod.meta.deleting


def test_getters_walk_paths() -> None:
    assert section(POD, "metadata", "labels")[tfa.COMPONENT] == "worker"
    assert section(POD, "spec", "nodeName") == {}  # a string is not a map
    assert section(None, "spec") == {} and section(POD) is POD
    assert text(POD, "spec", "nodeName") == "n1" and text(POD, "spec") == "" and text(POD) == ""
    assert items(POD, "metadata", "finalizers") == [tfa.FINALIZER, 7] and items(POD, "spec", "nodeName") == []


def test_finished_and_deleting() -> None:
    for phase, finished in (("Succeeded", True), ("Failed", True), ("Pending", False), ("Unknown", False)):
        assert Pod({"status": {"phase": phase}}).finished is finished
    deleting = Meta({"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": []})
    assert deleting.deleting and deleting.deletion_timestamp == "2026-01-01T00:00:00Z"
    assert Body({"kind": "GPU", "status": {"phase": "Running"}}).phase == "Running"
