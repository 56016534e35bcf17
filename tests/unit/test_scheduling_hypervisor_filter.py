"""The node filter for worker pods: a node whose allocatable `tensor-fusion.ai/index_0` is 0 has no
live hypervisor device plugin, so a pod asking for an index resource cannot start there."""

from __future__ import annotations

from typing import Any

from tfusion.api.accessors import Node, Pod
from tfusion.controller.scheduling import nodes as nc
from tfusion.embedded.kubelet import node_status


def node(allocatable: dict[str, str], rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": {}, "resourceVersion": rv}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", **allocatable},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}, "status": {"phase": "Pending"}}


WORKER = pod({"tensor-fusion.ai/index_3": "2"})
PLAIN = pod({})


def check(p: dict[str, Any], n: dict[str, Any]) -> nc.NodeFailure | None:
    return nc.check_node(nc.pod_demand(Pod(p)), Node(n), nc.Used())


def test_a_worker_pod_is_not_placed_where_index_0_is_zero() -> None:
    dead = node({"tensor-fusion.ai/index_0": "0", "tensor-fusion.ai/index_3": "0"})
    failure = check(WORKER, dead)
    assert failure is not None and failure.unresolvable and failure.check == "TensorFusionHypervisor"
    assert failure.message == nc.HYPERVISOR_GONE
    assert nc.fit_message(1, [failure.message]) == (
        "0/1 nodes are available: 1 node(s) had no running tensor-fusion hypervisor "
        "(allocatable tensor-fusion.ai/index_0 is 0).")
    assert check(PLAIN, dead) is None  # a pod without an index resource does not need the plugin


def test_a_live_plugin_and_a_node_without_the_resource_are_fine() -> None:
    assert check(WORKER, node({"tensor-fusion.ai/index_0": "36"})) is None
    assert check(WORKER, node({})) is None  # never registered a plugin: not refused (see nodes.py)


def test_the_verdict_cache_sees_the_plugin_come_back() -> None:
    verdicts = nc.StaticVerdicts()
    demand = nc.pod_demand(Pod(WORKER))
    assert verdicts.check(demand, Node(node({"tensor-fusion.ai/index_0": "0"}, rv="5"))) is not None
    assert verdicts.check(demand, Node(node({"tensor-fusion.ai/index_0": "36"}, rv="6"))) is None
    assert nc.pod_demand(Pod(PLAIN)).shape != demand.shape


def test_the_simulated_kubelet_reports_the_index_resources() -> None:
    status = node_status("gpu-1", index_devices=36)
    expected = {f"tensor-fusion.ai/index_{k:x}": "36" for k in range(16)}
    assert expected.items() <= status["allocatable"].items() and expected.items() <= status["capacity"].items()
    bare = node_status("gpu-1")
    assert not any(k.startswith("tensor-fusion.ai/index_") for k in bare["allocatable"])
    assert check(WORKER, node(status["allocatable"])) is None
