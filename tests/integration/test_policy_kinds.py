"""NetworkPolicy, PodDisruptionBudget, pods/eviction and the Endpoints controller against the embedded
API server over HTTP: stored and validated (422s naming the field), an eviction a budget forbids is
answered 429 and the pod stays, an allowed one deletes the pod, a budget's status is counted as kube's
disruption controller counts it (a percentage or maxUnavailable of the pods' controllers' scale,
unmanaged pods left out, an unscaled controller a SyncFailed condition), and a Service with a selector gets
Endpoints and an EndpointSlice listing its pods' addresses (the simulated kubelet gives them an IP)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.one_box import simulated_node
from tfusion.embedded.disruption import DisruptionController
from tfusion.embedded.endpoints import ENDPOINTS, ENDPOINTSLICES, EndpointsController
from tfusion.embedded.workloads.daemonset import DAEMONSETS
from tfusion.embedded.workloads.statefulset import STATEFULSETS
from tfusion.kube import resources as r
from tfusion.kube.client import Invalid, KubeClient, NotFound
from tfusion.kube.manager import Manager
from tfusion.kube.resources import ApiResource

pytestmark = pytest.mark.anyio
NS = "default"
NODE = "n1"
NETPOLS = ApiResource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True)
PDBS = ApiResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
DEPLOYMENTS, REPLICASETS = r.DEPLOYMENTS, r.REPLICASETS


def pdb(name: str = "web-pdb", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}


def netpol(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
            "spec": spec}


def pod(name: str, labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod bound to the simulated node; `owner` (a stored object) becomes its controller."""
    meta: dict[str, Any] = {"name": name, "labels": labels or {"app": "web"}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "controller": True,
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "image": "nginx", "ports": [{"name": "http", "containerPort": 8080}]}]}}


async def controller(kube: KubeClient, resource: ApiResource, name: str, replicas: int,
                     owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stored workload object whose scale a budget reads (no workload controller runs in these tests,
    so nothing acts on it); `owner` (a Deployment) controls it."""
    body: dict[str, Any] = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name},
                            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                                     "template": {"metadata": {"labels": {"app": "web"}},
                                                  "spec": {"containers": [{"name": "main", "image": "nginx"}]}}}}
    if resource is STATEFULSETS:
        body["spec"]["serviceName"] = name
    if owner is not None:
        body["metadata"]["ownerReferences"] = pod("x", owner=owner)["metadata"]["ownerReferences"]
    if resource is DAEMONSETS:
        del body["spec"]["replicas"]
    created: dict[str, Any] = await kube.create(resource, body, namespace=NS)
    return created


def fields(exc: Invalid) -> list[str]:
    return [c["field"] for c in exc.status["details"]["causes"]]


@pytest.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[KubeClient]:
    """A Manager running the Endpoints controller and a simulated kubelet for node n1."""
    def register(manager: Manager) -> None:
        EndpointsController(manager)
        DisruptionController(manager)

    async with simulated_node(kube, NODE, register) as client:
        yield client


async def test_network_policy_is_stored_and_validated(kube: KubeClient) -> None:
    created = await kube.create(NETPOLS, netpol(podSelector={}, policyTypes=["Ingress"]), namespace=NS)
    assert created["spec"]["policyTypes"] == ["Ingress"]
    got = await kube.get(NETPOLS, "deny", namespace=NS)
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    with pytest.raises(Invalid) as missing:
        await kube.create(NETPOLS, {**netpol(), "metadata": {"name": "bad"}}, namespace=NS)
    assert fields(missing.value) == ["spec.podSelector"]
    with pytest.raises(Invalid) as wrong:
        await kube.create(NETPOLS, {**netpol(podSelector={}, policyTypes=["Ingress", "Sideways"]),
                                    "metadata": {"name": "bad"}}, namespace=NS)
    assert fields(wrong.value) == ["spec.policyTypes[1]"] and "Sideways" in wrong.value.status["message"]


async def test_pdb_is_stored_and_validated(kube: KubeClient) -> None:
    created = await kube.create(PDBS, pdb(minAvailable="50%"), namespace=NS)
    assert (await kube.get(PDBS, "web-pdb", namespace=NS))["spec"]["minAvailable"] == "50%"
    assert created["metadata"]["generation"] == 1
    cases: list[tuple[dict[str, Any], str]] = [
        ({"minAvailable": 1, "maxUnavailable": 1}, "spec"), ({}, "spec.minAvailable"),
        ({"maxUnavailable": "lots"}, "spec.maxUnavailable"), ({"minAvailable": -1}, "spec.minAvailable")]
    for spec, field in cases:
        with pytest.raises(Invalid) as refused:
            await kube.create(PDBS, pdb("bad", **spec), namespace=NS)
        assert field in fields(refused.value), spec
    no_selector = pdb("bad", minAvailable=1)
    del no_selector["spec"]["selector"]
    with pytest.raises(Invalid) as refused:
        await kube.create(PDBS, no_selector, namespace=NS)
    assert fields(refused.value) == ["spec.selector"]


async def _ready_pods(kube: KubeClient, *names: str, owner: dict[str, Any] | None = None) -> None:
    for name in names:
        await kube.create(r.PODS, pod(name, owner=owner), namespace=NS)

    async def all_ready() -> bool:
        pods = (await kube.list(r.PODS, namespace=NS, label_selector="app=web")).items
        return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
                   for p in pods) == len(names)

    await eventually(all_ready, timeout=20)


async def _evict(apiserver: Any, name: str) -> Any:
    async with apiserver.http(timeout=10) as http:  # a raw POST: the status code and body are what is tested
        return await http.post(f"/api/v1/namespaces/{NS}/pods/{name}/eviction", json={
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS},
            "deleteOptions": {"gracePeriodSeconds": 0}})


async def test_eviction_honours_the_disruption_budget(cluster: KubeClient, apiserver: Any) -> None:
    kube = cluster
    owner = await controller(kube, STATEFULSETS, "web", 2)
    await _ready_pods(kube, "web-a", "web-b", owner=owner)
    await kube.create(PDBS, pdb(minAvailable=2), namespace=NS)
    blocked = await _evict(apiserver, "web-a")
    assert blocked.status_code == 429, blocked.text
    body = blocked.json()
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert "web-pdb" in body["details"]["causes"][0]["message"]
    assert (await kube.get(r.PODS, "web-a", namespace=NS))["metadata"]["name"] == "web-a"
    status = (await kube.get(PDBS, "web-pdb", namespace=NS))["status"]
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"],
            status["expectedPods"]) == (2, 2, 0, 2)
    # patches, not read-then-replace: the disruption controller writes the status meanwhile
    await kube.patch(PDBS, "web-pdb", {"spec": {"minAvailable": None, "maxUnavailable": 1}}, namespace=NS)
    allowed = await _evict(apiserver, "web-a")
    assert allowed.status_code == 201, allowed.text

    async def gone() -> bool:
        try:
            await kube.get(r.PODS, "web-a", namespace=NS)
        except NotFound:
            return True
        return False

    await eventually(gone, timeout=20)
    await kube.patch(PDBS, "web-pdb", {"spec": {"minAvailable": "100%", "maxUnavailable": None}}, namespace=NS)
    again = await _evict(apiserver, "web-b")  # a percentage of the StatefulSet's 2 replicas, not of the pod left
    assert again.status_code == 429, again.text
    assert "needs 2 healthy pods and has 1 currently" in again.json()["details"]["causes"][0]["message"]


async def _budget(kube: KubeClient, **wanted: int) -> dict[str, Any] | None:
    """The budget's status once it shows `wanted` (None before)."""
    status: dict[str, Any] = (await kube.get(PDBS, "web-pdb", namespace=NS)).get("status") or {}
    return status if all(status.get(k) == v for k, v in wanted.items()) else None


async def test_the_disruption_controller_counts_a_percentage_of_the_controllers_scale(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(PDBS, pdb(minAvailable="50%"), namespace=NS)
    deployment = await controller(kube, DEPLOYMENTS, "web", 4)
    replicaset = await controller(kube, REPLICASETS, "web-5d8f", 3, owner=deployment)
    await _ready_pods(kube, "web-a", "web-b", "web-c", owner=replicaset)

    # the Deployment's 4 replicas are expected, not the 3 pods there are (nor the ReplicaSet's 3)
    status = await eventually(lambda: _budget(kube, currentHealthy=3), timeout=20)
    assert (status["desiredHealthy"], status["disruptionsAllowed"], status["expectedPods"]) == (2, 1, 4)
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == \
        [("DisruptionAllowed", "True", "SufficientPods")]
    await kube.delete(r.PODS, "web-c", namespace=NS, grace_period_seconds=0)
    status = await eventually(lambda: _budget(kube, currentHealthy=2), timeout=20)
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (4, 2, 0)
    assert status["conditions"][0]["reason"] == "InsufficientPods"
    # scaling the Deployment down recounts the budget
    await kube.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 2}}, namespace=NS)
    status = await eventually(lambda: _budget(kube, expectedPods=2), timeout=20)
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (2, 1, 1)


async def test_an_integer_min_available_counts_the_pods_and_unmanaged_pods_are_left_out(
        cluster: KubeClient) -> None:
    kube = cluster
    await _ready_pods(kube, "web-a", "web-b", "web-c")
    await kube.create(PDBS, pdb(minAvailable=2), namespace=NS)
    status = await eventually(lambda: _budget(kube, currentHealthy=3), timeout=20)
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 2, 1)
    # a maxUnavailable budget counts controllers' scales: pods without a controller are not expected
    await kube.patch(PDBS, "web-pdb", {"spec": {"minAvailable": None, "maxUnavailable": 1}}, namespace=NS)
    status = await eventually(lambda: _budget(kube, expectedPods=0), timeout=20)
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 0, 3)

    async def warned() -> bool:
        events = (await kube.list(r.EVENTS, namespace=NS)).items
        return any(e.get("reason") == "UnmanagedPods" and e["involvedObject"]["name"] == "web-pdb" for e in events)

    await eventually(warned, timeout=20, what="the UnmanagedPods event")


async def test_a_budget_over_pods_of_an_unscaled_controller_allows_no_disruption(
        cluster: KubeClient, apiserver: Any) -> None:
    kube = cluster
    owner = await controller(kube, DAEMONSETS, "web", 0)
    await _ready_pods(kube, "web-a", "web-b", owner=owner)
    await kube.create(PDBS, pdb(maxUnavailable=1), namespace=NS)
    status = await eventually(lambda: _budget(kube, currentHealthy=2), timeout=20)
    assert status["disruptionsAllowed"] == 0
    condition = status["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "SyncFailed")
    assert condition["message"] == 'found no controllers for pod "web-a"'
    refused = await _evict(apiserver, "web-a")
    assert refused.status_code == 429, refused.text


async def test_service_with_a_selector_gets_endpoints(cluster: KubeClient) -> None:
    kube = cluster
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
    await kube.create(r.SERVICES, service, namespace=NS)
    await _ready_pods(kube, "web-a", "web-b")
    await kube.create(r.PODS, pod("other", {"app": "db"}), namespace=NS)

    async def listed() -> dict[str, Any] | None:
        try:
            endpoints = await kube.get(ENDPOINTS, "web", namespace=NS)
        except NotFound:
            return None
        subsets = endpoints.get("subsets") or []
        names = sorted(a["targetRef"]["name"] for s in subsets for a in s.get("addresses") or [])
        return endpoints if names == ["web-a", "web-b"] else None

    endpoints = await eventually(listed, timeout=20)
    assert endpoints is not None
    subset = endpoints["subsets"][0]
    assert subset["ports"] == [{"port": 8080, "protocol": "TCP", "name": "http"}]
    pods = {p["metadata"]["name"]: p for p in (await kube.list(r.PODS, namespace=NS)).items}
    assert {a["ip"] for a in subset["addresses"]} == {pods["web-a"]["status"]["podIP"]}
    slice_ = await kube.get(ENDPOINTSLICES, "web", namespace=NS)
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    assert sorted(e["targetRef"]["name"] for e in slice_["endpoints"] if e["conditions"]["ready"]) == [
        "web-a", "web-b"]
    await kube.delete(r.SERVICES, "web", namespace=NS)

    async def removed() -> bool:
        try:
            await kube.get(ENDPOINTS, "web", namespace=NS)
        except NotFound:
            return True
        return False

    await eventually(removed, timeout=20)


@needs_kubectl
async def test_kubectl_creates_a_pdb_and_a_network_policy(kube: KubeClient, apiserver: Any, tmp_path: Path) -> None:
    """`kubectl create pdb` sends protobuf; `kubectl apply` of a NetworkPolicy sends JSON."""
    base = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "--cache-dir", str(tmp_path / "cache")]
    created = subprocess.run([*base, "create", "pdb", "web-pdb", "--selector", "app=web", "--max-unavailable",
                              "25%"], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    spec = (await kube.get(PDBS, "web-pdb", namespace=NS))["spec"]
    assert spec == {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": "25%"}
    manifest = tmp_path / "netpol.yaml"
    manifest.write_text(json.dumps(netpol(podSelector={"matchLabels": {"app": "web"}}, policyTypes=["Egress"])))
    applied = subprocess.run([*base, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    table = subprocess.run([*base, "get", "pdb", "web-pdb"], capture_output=True, text=True, timeout=60)
    assert table.stdout.split()[:9] == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS",
                                        "AGE", "web-pdb"], table.stdout
    assert table.stdout.split()[9:12] == ["N/A", "25%", "0"], table.stdout
    assert (await kube.get(NETPOLS, "deny", namespace=NS))["spec"]["policyTypes"] == ["Egress"]
    bad = manifest.with_name("bad.yaml")
    bad.write_text(json.dumps(netpol(podSelector={}, policyTypes=["Both"])))
    refused = subprocess.run([*base, "apply", "-f", str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "spec.policyTypes[0]" in refused.stderr, refused.stderr
