"""Node checks before GPUs: Ready, cordon, taints/tolerations, nodeSelector, required node affinity
(every operator, matchFields), CPU/memory/pod-count fit with init containers and overhead, the
incremental usage totals, the verdict cache, and kube's FitError message."""

from __future__ import annotations

from typing import Any

import pytest

from tfusion.api.accessors import Node, Pod
from tfusion.controller.scheduling import nodes as nc


def node(name: str = "n1", *, ready: bool = True, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, unschedulable: bool = False, cpu: str = "4",
         memory: str = "8Gi", pods: str = "10", rv: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": labels or {}, "resourceVersion": rv}, "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(*, cpu: str | None = None, memory: str | None = None, tolerations: list[dict[str, str]] | None = None,
        selector: dict[str, str] | None = None, terms: list[dict[str, Any]] | None = None,
        node_name: str | None = None, uid: str = "u1", init_cpu: str | None = None,
        overhead_cpu: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if init_cpu:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": init_cpu}}}]
    if overhead_cpu:
        spec["overhead"] = {"cpu": overhead_cpu}
    if tolerations:
        spec["tolerations"] = tolerations
    if selector:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                             {"nodeSelectorTerms": terms}}}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": "p", "namespace": "default", "uid": uid}, "spec": spec,
            "status": {"phase": phase}}


def failure(p: dict[str, Any], n: dict[str, Any], used: nc.Used | None = None) -> str | None:
    found = nc.check_node(nc.pod_demand(Pod(p)), Node(n), used or nc.Used())
    return found.message if found else None


def test_a_plain_pod_fits_a_ready_node() -> None:
    assert failure(pod(cpu="1"), node()) is None


def test_not_ready_and_cordoned_nodes_fail_unless_tolerated() -> None:
    assert failure(pod(), node(ready=False)) == "node(s) were not ready"
    assert failure(pod(tolerations=[{"key": nc.NOT_READY_TAINT, "operator": "Exists"}]), node(ready=False)) is None
    assert failure(pod(), node(unschedulable=True)) == "node(s) were unschedulable"
    tolerate = [{"key": nc.UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    assert failure(pod(tolerations=tolerate), node(unschedulable=True)) is None


@pytest.mark.parametrize("toleration, tolerated", [
    ({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, True),
    ({"key": "gpu", "value": "yes"}, True),  # Equal is the default operator, any effect
    ({"key": "gpu", "operator": "Equal", "value": "no"}, False),
    ({"key": "gpu", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),  # tolerates everything
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
])
def test_tolerations_match_kube_rules(toleration: dict[str, str], tolerated: bool) -> None:
    n = node(taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])
    expected = None if tolerated else "node(s) had untolerated taint {gpu: yes}"
    assert failure(pod(tolerations=[toleration]), n) == expected


def test_no_execute_blocks_and_prefer_no_schedule_does_not() -> None:
    assert failure(pod(), node(taints=[{"key": "k", "value": "v", "effect": "NoExecute"}])) == \
        "node(s) had untolerated taint {k: v}"
    assert failure(pod(), node(taints=[{"key": "k", "value": "v", "effect": "PreferNoSchedule"}])) is None


def test_node_selector() -> None:
    assert failure(pod(selector={"zone": "a"}), node(labels={"zone": "a"})) is None
    assert failure(pod(selector={"zone": "a"}), node(labels={"zone": "b"})) == nc.AFFINITY


@pytest.mark.parametrize("operator, values, labels, fits", [
    ("In", ["a", "b"], {"zone": "b"}, True),
    ("In", ["a"], {"zone": "b"}, False),
    ("In", ["a"], {}, False),
    ("NotIn", ["a"], {"zone": "b"}, True),
    ("NotIn", ["a"], {}, True),
    ("NotIn", ["a"], {"zone": "a"}, False),
    ("Exists", [], {"zone": "x"}, True),
    ("Exists", [], {}, False),
    ("DoesNotExist", [], {}, True),
    ("DoesNotExist", [], {"zone": "x"}, False),
    ("Gt", ["4"], {"zone": "5"}, True),
    ("Gt", ["4"], {"zone": "4"}, False),
    ("Gt", ["4"], {"zone": "x"}, False),
    ("Lt", ["4"], {"zone": "3"}, True),
    ("Lt", ["4"], {"zone": "4"}, False),
])
def test_required_affinity_operators(operator: str, values: list[str], labels: dict[str, str], fits: bool) -> None:
    terms = [{"matchExpressions": [{"key": "zone", "operator": operator, "values": values}]}]
    assert (failure(pod(terms=terms), node(labels=labels)) is None) is fits


def test_affinity_terms_are_ored_requirements_anded_and_match_fields_on_name() -> None:
    terms: list[dict[str, Any]] = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                                         {"key": "gpu", "operator": "Exists"}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}]
    assert failure(pod(terms=terms), node(labels={"zone": "a", "gpu": "1"})) is None
    assert failure(pod(terms=terms), node(labels={"zone": "a"})) == nc.AFFINITY
    assert failure(pod(terms=terms), node("special")) is None
    not_in = [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]
    assert failure(pod(terms=not_in), node("n1")) == nc.AFFINITY
    assert failure(pod(terms=[{}]), node()) == nc.AFFINITY  # an empty term matches nothing


def test_cpu_memory_and_pod_count_fit_against_what_is_used() -> None:
    n = node(cpu="4", memory="8Gi", pods="3")
    assert failure(pod(cpu="3"), n, nc.Used(cpu_milli=1000)) is None
    assert failure(pod(cpu="3"), n, nc.Used(cpu_milli=1500)) == "Insufficient cpu"
    assert failure(pod(memory="5Gi"), n, nc.Used(memory=4 * 2**30)) == "Insufficient memory"
    assert failure(pod(), n, nc.Used(pods=3)) == "Too many pods"
    found = nc.check_node(nc.pod_demand(Pod(pod(cpu="3"))), Node(n), nc.Used(cpu_milli=1500))
    assert found is not None and (found.resource, found.requested, found.available, found.unresolvable) == \
        ("cpu", 3000, 2500, False)


def test_pod_request_takes_init_containers_and_overhead() -> None:
    assert nc.pod_requests(Pod(pod(cpu="500m", init_cpu="2"))) == (2000, 0)
    assert nc.pod_requests(Pod(pod(cpu="500m", init_cpu="100m", overhead_cpu="250m"))) == (750, 0)


def test_static_failures_are_unresolvable() -> None:
    found = nc.check_node(nc.pod_demand(Pod(pod())), Node(node(unschedulable=True)), nc.Used())
    assert found is not None and found.unresolvable


def test_usage_counts_bound_pods_and_forgets_finished_and_deleted_ones() -> None:
    usage = nc.NodeUsage()
    usage.observe(Pod(pod(cpu="1", memory="1Gi", node_name="n1", uid="a")))
    usage.observe(Pod(pod(cpu="2", node_name="n1", uid="b")))
    usage.observe(Pod(pod(cpu="2", uid="pending")))  # unbound: counts nowhere
    assert (usage.used("n1").cpu_milli, usage.used("n1").memory, usage.used("n1").pods) == (3000, 2**30, 2)
    usage.observe(Pod(pod(cpu="2", node_name="n1", uid="b", phase="Succeeded")))
    usage.observe_delete(Pod(pod(uid="a")))
    assert usage.used("n1").pods == 0
    usage.assume("c", "n2", 100, 0)
    usage.observe(Pod(pod(cpu="100m", node_name="n2", uid="c")))  # the watch confirms: not counted twice
    assert (usage.used("n2").cpu_milli, usage.used("n2").pods) == (100, 1)


def test_verdict_cache_follows_the_node_resource_version() -> None:
    cache = nc.StaticVerdicts()
    demand = nc.pod_demand(Pod(pod()))
    assert cache.check(demand, Node(node(rv="1"))) is None
    cordoned = node(rv="2", unschedulable=True)
    found = cache.check(demand, Node(cordoned))
    assert found is not None and found.message == nc.UNSCHEDULABLE


def test_is_pending() -> None:
    assert nc.is_pending(Pod(pod()))
    assert not nc.is_pending(Pod(pod(node_name="n1")))
    assert not nc.is_pending(Pod(pod(phase="Failed")))
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not nc.is_pending(Pod(deleting))


def test_fit_message_is_kube_style() -> None:
    reasons = ["Insufficient cpu", "node(s) had untolerated taint {k: v}", "Insufficient cpu"]
    assert nc.fit_message(5, reasons) == \
        "0/5 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu."
