"""The DaemonSet and StatefulSet controllers of --role=all, in-process with a Manager and the simulated
kubelet, against the embedded API server over HTTP: a DaemonSet's pod per matching node and its
rolling replacement, a StatefulSet's ordinal pods started in order and stopped in reverse, and the
API server's defaults and 422s for both kinds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.one_box import simulated_node
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.embedded.workloads.daemonset import DAEMONSETS, REVISION_HASH
from tfusion.embedded.workloads.statefulset import POD_NAME, STATEFULSETS
from tfusion.kube import resources as r
from tfusion.kube.client import Invalid, KubeClient

pytestmark = pytest.mark.anyio
NODE = "n1"
NS = "default"


@pytest.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[KubeClient]:
    """A Manager running the workload controllers and a simulated kubelet for node n1."""
    async with simulated_node(kube, NODE, WorkloadControllers) as client:
        yield client


def template(app: str, image: str = "busybox:1.36", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "image": image}], **spec}}


def daemonset(name: str = "agent", **pod_spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": template(name, **pod_spec)}}


def statefulset(replicas: int = 3, **spec: Any) -> dict[str, Any]:
    # no scheduler runs here: the template binds its pods to the simulated kubelet's node
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"replicas": replicas, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": template("db", nodeName=NODE), **spec}}


async def live_pods(kube: KubeClient, app: str) -> list[dict[str, Any]]:
    return [p for p in (await kube.list(r.PODS, namespace=NS, label_selector=f"app={app}")).items
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def test_a_daemonset_runs_one_ready_pod_on_the_node(cluster: KubeClient) -> None:
    kube = cluster
    created = await kube.create(DAEMONSETS, daemonset(), namespace=NS)
    assert created["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                 "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}

    async def status() -> dict[str, Any] | None:
        found = (await kube.get(DAEMONSETS, "agent", namespace=NS)).get("status") or {}
        return found if found.get("numberReady") == 1 else None

    reported = await eventually(status, 15, what="numberReady 1")
    assert (reported["desiredNumberScheduled"], reported["currentNumberScheduled"],
            reported["updatedNumberScheduled"], reported["numberMisscheduled"]) == (1, 1, 1, 0)
    pods = await live_pods(kube, "agent")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Running"
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("DaemonSet", created["metadata"]["uid"], True)


async def test_a_daemonset_template_change_replaces_its_pod(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(DAEMONSETS, daemonset(), namespace=NS)
    first = await eventually(lambda: _one_ready(kube, "busybox:1.36"), 15, what="the first pod")
    await kube.patch(DAEMONSETS, "agent", {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": "busybox:1.37"}]}}}}, namespace=NS, patch_type="strategic")
    second = await eventually(lambda: _one_ready(kube, "busybox:1.37"), 15, what="the replacement pod")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["metadata"]["labels"][REVISION_HASH] != first["metadata"]["labels"][REVISION_HASH]

    async def rolled() -> dict[str, Any] | None:
        found = (await kube.get(DAEMONSETS, "agent", namespace=NS)).get("status") or {}
        return found if (found.get("updatedNumberScheduled"), found.get("numberReady")) == (1, 1) else None

    await eventually(rolled, 15, what="updatedNumberScheduled 1")


async def _one_ready(kube: KubeClient, image: str) -> dict[str, Any] | None:
    pods = await live_pods(kube, "agent")
    if len(pods) == 1 and ready(pods[0]) and pods[0]["spec"]["containers"][0]["image"] == image:
        return pods[0]
    return None


async def test_a_daemonset_whose_selector_no_node_matches_has_no_pod(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(DAEMONSETS, daemonset("gpu-only", nodeSelector={"tfusion.dev/none": "true"}), namespace=NS)

    async def observed() -> dict[str, Any] | None:
        found = await kube.get(DAEMONSETS, "gpu-only", namespace=NS)
        return found["status"] if found.get("status", {}).get("observedGeneration") == 1 else None

    reported = await eventually(observed, 15, what="the DaemonSet's status")
    assert reported["desiredNumberScheduled"] == reported["currentNumberScheduled"] == 0
    assert await live_pods(kube, "gpu-only") == []


class PodLog:
    """What a pod watch saw, in order: ("added"|"ready"|"deleting"|"deleted", name)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def follow(self, kube: KubeClient, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        start = (await kube.list(r.PODS, namespace=NS)).resource_version
        task_status.started()
        async with contextlib.aclosing(kube.watch(r.PODS, namespace=NS, label_selector="app=db",
                                                  resource_version=start)) as events:
            async for kind, pod in events:
                self._note(kind, pod)

    def _note(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "ADDED":
            self.seen.append(("added", name))
        if kind == "DELETED":
            self.seen.append(("deleted", name))
        elif ready(pod) and ("ready", name) not in self.seen:
            self.seen.append(("ready", name))
        elif pod["metadata"].get("deletionTimestamp") and ("deleting", name) not in self.seen:
            self.seen.append(("deleting", name))

    def at(self, what: str, name: str) -> int:
        return self.seen.index((what, name))

    def first_gone(self, name: str) -> int:
        """Where the pod was first seen going: marked for deletion (graceful) or deleted outright."""
        return min(i for i, (what, seen) in enumerate(self.seen) if seen == name and what in ("deleting", "deleted"))


async def test_a_statefulset_starts_pods_in_order_and_stops_them_in_reverse(cluster: KubeClient) -> None:
    kube = cluster
    log = PodLog()
    async with anyio.create_task_group() as tg:
        await tg.start(log.follow, kube)
        created = await kube.create(STATEFULSETS, statefulset(3), namespace=NS)
        assert (created["spec"]["podManagementPolicy"], created["spec"]["updateStrategy"]) == \
            ("OrderedReady", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        status = await eventually(lambda: _sts_status(kube, ready=3), 20, what="readyReplicas 3")
        assert (status["replicas"], status["currentReplicas"], status["updatedReplicas"]) == (3, 3, 3)
        pods = {p["metadata"]["name"]: p for p in await live_pods(kube, "db")}
        assert sorted(pods) == ["db-0", "db-1", "db-2"]
        for name, pod in pods.items():
            assert pod["metadata"]["labels"][POD_NAME] == name
            assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (name, "db")
        # each ordinal is created only once the one before it is Ready
        assert log.at("ready", "db-0") < log.at("added", "db-1") < log.at("ready", "db-1") < log.at("added", "db-2")

        await kube.patch(STATEFULSETS, "db", {"spec": {"replicas": 1}}, namespace=NS)
        await eventually(lambda: _sts_status(kube, ready=1, replicas=1), 20, what="scaled to 1")
        await eventually(lambda: ("deleted", "db-1") in log.seen, 10, what="db-1's DELETED event")
        # the highest ordinal goes first, and db-1 is not touched until db-2 is gone
        assert log.at("deleted", "db-2") < log.first_gone("db-1"), log.seen
        assert ("deleting", "db-0") not in log.seen
        assert [p["metadata"]["name"] for p in await live_pods(kube, "db")] == ["db-0"]
        tg.cancel_scope.cancel()


async def _sts_status(kube: KubeClient, *, ready: int, replicas: int | None = None) -> dict[str, Any] | None:
    status = (await kube.get(STATEFULSETS, "db", namespace=NS)).get("status") or {}
    if status.get("readyReplicas") != ready or (replicas is not None and status.get("replicas") != replicas):
        return None
    return status


async def test_the_api_server_refuses_invalid_sets(kube: KubeClient) -> None:
    with pytest.raises(Invalid) as refused:
        await kube.create(STATEFULSETS, statefulset(podManagementPolicy="Whenever"), namespace=NS)
    assert "spec.podManagementPolicy" in str(refused.value)
    with pytest.raises(Invalid) as refused:
        await kube.create(DAEMONSETS, {**daemonset(), "spec": {**daemonset()["spec"],
                                                               "selector": {"matchLabels": {"app": "other"}}}},
                          namespace=NS)
    assert "spec.template.metadata.labels" in str(refused.value)
    await kube.create(STATEFULSETS, statefulset(0), namespace=NS)
    with pytest.raises(Invalid) as refused:
        await kube.patch(STATEFULSETS, "db", {"spec": {"serviceName": "other"}}, namespace=NS)
    assert "updates to statefulset spec for fields other than" in str(refused.value)
    scaled = await kube.patch(STATEFULSETS, "db", {"spec": {"replicas": 2}}, namespace=NS)
    assert scaled["spec"]["replicas"] == 2
