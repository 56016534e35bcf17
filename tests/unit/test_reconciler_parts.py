"""Pure parts of tfusion/controller/reconcilers: node selectors and pool choice, pool derivation from
a cluster, retry backoff, status comparison, the hypervisor's last report; and the hypervisor
DaemonSet under deploy/base/hypervisor as `kubectl kustomize` renders it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, GpuPool, Node
from tfusion.api.jsontypes import JsonMapping, json_object
from tfusion.controller.reconcilers.cluster import RETRY_BASE_S, RETRY_MAX_S, pools_of_cluster, retry_delay
from tfusion.controller.reconcilers.common import changed_fields, condition, merge_conditions, sum_capacity
from tfusion.controller.reconcilers.gpunode import is_missing, last_report
from tfusion.controller.reconcilers.nodeselector import node_selector_matches, select_pool, selector_hash

REPO = Path(__file__).resolve().parents[2]


def node(name: str = "n1", **labels: str) -> Node:
    return Node({"metadata": {"name": name, "labels": labels}})


def term(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        out["matchFields"] = fields
    return out


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(("requirement", "labels", "expected"), [
    (expr("gpu", "In", "true"), {"gpu": "true"}, True),
    (expr("gpu", "In", "true"), {"gpu": "false"}, False),
    (expr("gpu", "In", "true"), {}, False),
    (expr("gpu", "NotIn", "false"), {}, True),
    (expr("gpu", "NotIn", "false"), {"gpu": "false"}, False),
    (expr("gpu", "Exists"), {"gpu": ""}, True),
    (expr("gpu", "DoesNotExist"), {"gpu": ""}, False),
    (expr("count", "Gt", "2"), {"count": "3"}, True),
    (expr("count", "Gt", "2"), {"count": "2"}, False),
    (expr("count", "Lt", "2"), {"count": "x"}, False),
    (expr("count", "Between", "2"), {"count": "2"}, False),
])
def test_one_requirement(requirement: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    selector = {"nodeSelectorTerms": [term(requirement)]}
    assert node_selector_matches(selector, node(**labels)) is expected


def test_terms_are_ored_and_requirements_anded() -> None:
    both = term(expr("a", "In", "1"), expr("b", "In", "1"))
    selector = {"nodeSelectorTerms": [both, term(expr("c", "Exists"))]}
    assert node_selector_matches(selector, node(a="1", b="1"))
    assert not node_selector_matches(selector, node(a="1"))
    assert node_selector_matches(selector, node(c="x"))
    assert node_selector_matches(None, node())  # no selector: every node
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, node())  # an empty term: none
    by_name = {"nodeSelectorTerms": [term(fields=[expr("metadata.name", "In", "n1")])]}
    assert node_selector_matches(by_name, node("n1")) and not node_selector_matches(by_name, node("n2"))


def pool(name: str, selector: dict[str, Any] | None, *, deleting: bool = False, **extra: Any) -> GpuPool:
    config: dict[str, Any] = {"nodeSelector": selector} if selector else {}
    config.update(extra)
    metadata = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return GpuPool({"metadata": metadata, "spec": {"nodeManagerConfig": config}})


def test_first_pool_by_name_and_vendor_selector_wins() -> None:
    gpu = {"nodeSelectorTerms": [term(expr("nvidia.com/gpu.present", "In", "true"))]}
    amd = {"nodeSelectorTerms": [term(expr("amd", "Exists"))]}
    pools = [pool("b-pool", gpu), pool("a-pool", gpu), pool("c-pool", None)]
    assert select_pool(pools, node(**{"nvidia.com/gpu.present": "true"})) == "a-pool"
    assert select_pool(pools[:2], node()) is None
    assert select_pool([pool("c-pool", None)], node()) is None, "a pool without a selector selects no node"
    vendor_pool = pool("0-pool", gpu, multiVendorNodeSelector={"AMD": amd})
    assert select_pool([vendor_pool], node(amd="1", **{tfa.HARDWARE_VENDOR: "AMD"})) == "0-pool"
    assert select_pool([vendor_pool], node(amd="1")) is None, "NVIDIA (the default vendor) has no AMD selector"
    amd_default = pool("1-pool", None, defaultVendor="AMD", multiVendorNodeSelector={"AMD": amd})
    assert select_pool([amd_default], node(amd="1")) == "1-pool", "the pool's default vendor"
    deleting = pool("a-pool", gpu, deleting=True)
    assert select_pool([deleting], node(**{"nvidia.com/gpu.present": "true"})) is None


def test_selector_hash_follows_the_selectors_only() -> None:
    gpu = {"nodeSelectorTerms": [term(expr("gpu", "Exists"))]}
    base = selector_hash(pool("a", gpu))
    assert base == selector_hash(pool("b", gpu, defaultVendor="NVIDIA")) and len(base) == 16
    assert base != selector_hash(pool("a", {"nodeSelectorTerms": [term(expr("gpu", "DoesNotExist"))]}))


def test_pools_of_a_cluster() -> None:
    cluster: dict[str, Any] = {"metadata": {"name": "c", "uid": "u1", "labels": {"team": "ml"}}, "spec": {"gpuPools": [
        {"name": "a", "isDefault": True, "specTemplate": {"nodeManagerConfig": {}}}, {"name": "b"}]}}
    pools: list[Any] = pools_of_cluster(Body(cluster))  # JSON dug into below
    a, b = pools
    assert (a["metadata"]["name"], b["metadata"]["name"]) == ("c-a", "c-b")
    assert a["metadata"]["labels"] == {"team": "ml", tfa.MANAGED_BY: "c"}
    assert (a["metadata"]["annotations"][tfa.IS_DEFAULT_POOL], b["metadata"]["annotations"][tfa.IS_DEFAULT_POOL]) \
        == ("true", "false")
    assert a["metadata"]["ownerReferences"] == [{"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionCluster",
                                                 "name": "c", "uid": "u1", "controller": True,
                                                 "blockOwnerDeletion": True}]
    assert a["spec"] == {"nodeManagerConfig": {}} and b["spec"] == {}
    a["spec"]["changed"] = True
    assert "changed" not in cluster["spec"]["gpuPools"][0]["specTemplate"], "a copy, not the cluster's template"


def test_retry_delay_is_bounded() -> None:
    for retries in (0, 1, 5, 50, 10_000):
        for _ in range(20):
            assert RETRY_BASE_S <= retry_delay(retries) <= RETRY_MAX_S
    assert max(retry_delay(30) for _ in range(50)) > RETRY_BASE_S * 4, "it grows"


def test_conditions_keep_their_transition_time_and_compare_without_it() -> None:
    first = condition(None, "Ready", True, "Ok", "fine", generation=2)
    assert first["status"] == "True" and first["observedGeneration"] == 2
    old: list[JsonMapping] = [{**json_object(first), "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    same = condition(old, "Ready", True, "Ok", "fine", generation=2)
    assert same["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped = condition(old, "Ready", False, "Bad", "broken")
    assert flipped["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    other = {"type": "Theirs", "status": "True"}
    assert merge_conditions([other, *old], [flipped]) == [other, flipped]
    assert changed_fields({"phase": "Running", "conditions": old},
                          {"phase": "Running", "conditions": [json_object(same)]}) == {}
    assert changed_fields({"conditions": old}, {"conditions": [json_object(flipped)]}) == {"conditions": [flipped]}


def test_capacity_sums() -> None:
    summed = sum_capacity([{"totalTFlops": "100", "totalVRAM": "40Gi", "availableTFlops": "20500m"},
                           {"totalTFlops": "0.5", "totalVRAM": "512Mi", "availableVRAM": "bogus"}])
    assert summed["totalTFlops"] == "100500m" and summed["totalVRAM"] == "41472Mi"
    assert summed["availableTFlops"] == "20500m" and summed["availableVRAM"] == "0"


def test_last_report_is_the_newest_readable_stamp() -> None:
    def gpu(**notes: str) -> Gpu:
        return Gpu({"metadata": {"name": "g", "annotations": notes}})

    assert last_report([]) is None and last_report([gpu()]) is None
    assert last_report([gpu(**{tfa.LAST_SYNC: "yesterday"})]) is None
    stamps = [gpu(**{tfa.LAST_SYNC: "2026-01-01T00:00:00Z"}), gpu(**{tfa.LAST_SYNC: "2026-01-01T00:01:00Z"})]
    assert last_report(stamps) == last_report(stamps[1:])
    assert is_missing(gpu(**{tfa.GPU_MISSING_SINCE: "2026-01-01T00:00:00Z"})) and not is_missing(gpu())




@needs_kubectl
def test_hypervisor_daemonset_renders() -> None:
    out = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy/overlays/builtin-scheduler")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout)}
    daemonset = docs[("DaemonSet", "tensor-fusion-hypervisor")]
    assert daemonset["metadata"]["namespace"] == "tensor-fusion-sys"
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "tensor-fusion-hypervisor-sa"
    container = pod["containers"][0]
    assert "--role=hypervisor" in container["args"] and container["ports"][0]["hostPort"] == 8001
    env = {e["name"]: e for e in container["env"]}
    assert env["GPU_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/run/tensor-fusion", "/run/nvidia/driver"} <= mounts
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} >= {"/run/tensor-fusion",
                                                                                  "/run/nvidia/driver"}
    assert "/logs" in mounts and "--metrics-output-path=/logs/metrics.log" in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8001}
    assert ("ServiceAccount", "tensor-fusion-hypervisor-sa") in docs
    binding = docs[("ClusterRoleBinding", "tensor-fusion-hypervisor")]
    assert binding["subjects"][0]["namespace"] == "tensor-fusion-sys"
    rules = docs[("ClusterRole", "tensor-fusion-hypervisor")]["rules"]
    assert any("gpus" in rule["resources"] and "create" in rule["verbs"] for rule in rules)
