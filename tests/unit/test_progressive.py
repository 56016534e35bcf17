"""Progressive migration's pure parts: which pods the webhook only sends to tensor-fusion-scheduler
(and the patch it answers), the used-by taint a node gets or loses, which pods count as workers
on a node, and the native GPU (extended resource) node check."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Node, Pod
from tfusion.apiserver.patch import json_patch
from tfusion.controller.scheduling import nodes as nc
from tfusion.controller.scheduling import progressive
from tfusion.controller.webhook.mutate import Context, progressive_only, progressive_pod, selects
from tfusion.controller.webhook.patch import json_diff

PROVIDER: dict[str, Any] = {"metadata": {"name": "nvidia"},
                            "spec": {"vendor": "NVIDIA", "inUseResourceNames": ["nvidia.com/gpu"]}}
TAINT = {"key": tfa.USED_BY, "value": tfa.USED_BY_TENSOR_FUSION, "effect": "PreferNoSchedule"}


def ctx(*, on: bool = True, auto: dict[str, Any] | None = None) -> Context:
    return Context(pools=[], provider_configs=[PROVIDER], progressive=on, auto_migration=auto)


def native(gpus: str = "1", *, labels: dict[str, str] | None = None, scheduler: str | None = None,
           resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "pytorch",
                                            "resources": {"limits": {resource: gpus}}}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": "p", "namespace": "ns", "labels": dict(labels or {})}, "spec": spec}


def test_a_native_gpu_pod_is_only_sent_to_our_scheduler() -> None:
    pod = native()
    assert selects(Pod(pod), ctx()) and progressive_only(Pod(pod), ctx())
    before = copy.deepcopy(pod)
    out = progressive_pod(Pod(pod))
    assert pod == before
    ops = json_diff(pod, out)
    assert ops == [{"op": "add", "path": "/spec/schedulerName", "value": tfa.SCHEDULER_NAME}]
    assert json_patch(pod, ops) == {**pod, "spec": {**pod["spec"], "schedulerName": tfa.SCHEDULER_NAME}}
    explicit = native(scheduler="default-scheduler")
    assert json_diff(explicit, progressive_pod(Pod(explicit))) == [
        {"op": "replace", "path": "/spec/schedulerName", "value": tfa.SCHEDULER_NAME}]


@pytest.mark.parametrize(("pod", "context", "why"), [
    (native(), ctx(on=False), "the mode is off"),
    (native(labels={tfa.ENABLED: "true"}), ctx(), "a TensorFusion pod is mutated in full"),
    (native(labels={tfa.ENABLED: "false"}), ctx(), "the pod opted out"),
    (native(labels={tfa.ENABLED: "maybe"}), ctx(), "a malformed label is analyse's to deny"),
    (native(scheduler="volcano"), ctx(), "another scheduler was chosen on purpose"),
    (native(resource="amd.com/gpu"), ctx(), "not a resource the ProviderConfigs take over"),
    (native("0"), ctx(), "no GPU asked for"),
    (native(), ctx(auto={"enable": True}), "auto-migration takes it"),
])
def test_other_pods_are_not_progressive(pod: dict[str, Any], context: Context, why: str) -> None:
    assert not progressive_only(Pod(pod), context), why


def test_a_pod_auto_migration_excludes_is_progressive() -> None:
    auto = {"enable": True, "scope": {"excludes": {"namespaceNames": ["ns"]}}}
    assert progressive_only(Pod(native()), ctx(auto=auto))


def test_selects_sends_native_pods_to_analysis_only_in_a_migration_mode() -> None:
    assert not selects(Pod(native()), ctx(on=False))
    assert selects(Pod(native()), ctx(on=False, auto={"enable": True}))
    assert not selects(Pod({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}), ctx())


def test_the_taint_is_added_while_busy_and_removed_when_idle() -> None:
    other = {"key": "team", "value": "ml", "effect": "NoSchedule"}
    node: dict[str, Any] = {"spec": {"taints": [other]}}
    assert progressive.taints_for(Node(node), True) == [other, TAINT]
    assert progressive.taints_for(Node(node), False) is None
    busy = {"spec": {"taints": [TAINT, other]}}
    assert progressive.taints_for(Node(busy), True) is None
    assert progressive.taints_for(Node(busy), False) == [other]
    assert progressive.taints_for(Node({"spec": {}}), True) == [TAINT]
    # a used-by PreferNoSchedule taint of another value is replaced by ours, not doubled
    stale = {"spec": {"taints": [{**TAINT, "value": "someone"}]}}
    assert progressive.taints_for(Node(stale), True) == [TAINT]
    # the NoSchedule taint of the same key is not ours to remove
    legacy = {"key": tfa.USED_BY, "value": tfa.USED_BY_TENSOR_FUSION, "effect": "NoSchedule"}
    assert progressive.taints_for(Node({"spec": {"taints": [legacy]}}), False) is None


def worker(phase: str = "Pending", node: str | None = "n1", component: str = "worker") -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"labels": {tfa.COMPONENT: component}}, "spec": spec, "status": {"phase": phase}}


def test_a_worker_counts_on_its_node_while_bound_and_not_finished() -> None:
    assert progressive.worker_node_index(worker()) == ["n1"]
    assert progressive.worker_node_index(worker("Running")) == ["n1"]
    assert progressive.worker_node_index(worker("Succeeded")) == []
    assert progressive.worker_node_index(worker("Failed")) == []
    assert progressive.worker_node_index(worker(node=None)) == []
    assert progressive.worker_node_index(worker(component="client")) == []


def test_native_gpu_requests_and_the_extended_resource_check() -> None:
    pod: dict[str, Any] = {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}},
        {"name": "c"}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    assert nc.extended_requests(Pod(pod), ["nvidia.com/gpu", "amd.com/gpu"]) == {"nvidia.com/gpu": 4}
    assert nc.extended_requests(Pod({"spec": {"containers": [{"name": "a"}]}}), ["nvidia.com/gpu"]) == {}
    node = Node({"status": {"allocatable": {"nvidia.com/gpu": "4"}}})
    assert nc.extended_check({"nvidia.com/gpu": 3}, node, {"nvidia.com/gpu": 1}) is None
    failure = nc.extended_check({"nvidia.com/gpu": 3}, node, {"nvidia.com/gpu": 2})
    assert failure is not None and failure.message == "Insufficient nvidia.com/gpu"
    assert (failure.requested, failure.available, failure.unresolvable) == (3, 2, False)
    missing = nc.extended_check({"nvidia.com/gpu": 1}, Node({"status": {"allocatable": {}}}), {})
    assert missing is not None and missing.available == 0
