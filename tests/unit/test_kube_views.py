"""The kube layer and the hypervisor read objects through the typed views: what they get from
well-formed objects, and that a wrong-typed field reads as absent instead of raising."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api import annotations as keys
from tfusion.api.accessors import Body
from tfusion.hypervisor.http import auto_freeze_rule
from tfusion.kube.client import object_key
from tfusion.kube.informer import _beyond_status, namespace_index, node_name_index
from tfusion.kube.reconciler import controller_owner_keys, generation_changed, spec_changed
from tfusion.kube.resources import GPUPOOLS


@pytest.mark.parametrize(("obj", "nodes"), [
    ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}, ["n1"]),
    ({"kind": "GPU", "metadata": {"name": "g"}, "status": {"nodeSelector": {"kubernetes.io/hostname": "n2"}}},
     ["n2"]),
    ({"kind": "GPU", "metadata": {"name": "g", "labels": {keys.MANAGED_BY: "n3"}}}, ["n3"]),
    ({"kind": "GPUNode", "metadata": {"name": "n4"}}, ["n4"]),
    ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": 7}}, []),
    ({"kind": "Pod", "metadata": [], "spec": ["not", "a", "map"], "status": "odd"}, []),
])
def test_node_name_index_reads_each_kind(obj: dict[str, Any], nodes: list[str]) -> None:
    assert node_name_index(obj) == nodes


def test_namespace_index_and_object_key() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}}
    assert namespace_index(pod) == ["ns"] and object_key(pod) == "ns/p"
    node = {"metadata": {"name": "n"}}
    assert namespace_index(node) == [] and object_key(node) == "n"


def test_predicates_compare_through_the_views() -> None:
    meta: dict[str, Any] = {"name": "a", "generation": 1, "labels": {"x": "1"}}
    old: dict[str, Any] = {"metadata": meta, "spec": {"v": 1}}
    assert not generation_changed(old, {**old, "status": {"phase": "Running"}})
    assert generation_changed(old, {**old, "metadata": {**meta, "generation": 2}})
    assert not spec_changed(old, {**old, "status": {"phase": "Running"}})
    assert spec_changed(old, {**old, "metadata": {**meta, "labels": {"x": "2"}}})
    assert spec_changed(old, {**old, "metadata": {**meta, "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not spec_changed({"metadata": "broken"}, {"metadata": {}}), "a malformed map reads as empty"
    assert not _beyond_status(Body(old), Body({**old, "metadata": {**meta, "resourceVersion": "9"}}))


def test_owner_keys_follow_the_controller_reference() -> None:
    keys_of = controller_owner_keys(GPUPOOLS)
    owned: dict[str, Any] = {"metadata": {"name": "g", "ownerReferences": [
        {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-a", "controller": True},
        {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-b"},
        "not a reference"]}}
    assert keys_of(owned) == ["pool-a"]
    assert keys_of({"metadata": {"ownerReferences": {"kind": "GPUPool"}}}) == []


def test_auto_freeze_rule_reads_a_config_that_is_not_an_object_as_none() -> None:
    config = '{"autoFreezeAndResume": {"autoFreeze": [{"qos": "High", "enable": true, "freezeToMemTTL": "5m"}]}}'
    assert auto_freeze_rule(config, "high") == {"enable": True, "freeze_to_mem_ttl": "5m"}
    assert auto_freeze_rule("[1, 2]", "high") is None
    assert auto_freeze_rule('{"autoFreezeAndResume": []}', "high") is None
