"""The DaemonSet and StatefulSet controllers of --role=all, in-process with a Manager and the simulated
kubelet, against the embedded API server over HTTP: a DaemonSet's pod per matching node and its
rolling replacement (with maxSurge too), a StatefulSet's ordinal pods started in order and stopped in
reverse, the ControllerRevisions both keep (read and undone by the real kubectl), and the API
server's defaults and 422s for both kinds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.one_box import simulated_node
from tfusion.embedded.volumes import PVCS, VolumeBinder
from tfusion.embedded.workloads import WorkloadControllers
from tfusion.embedded.workloads.daemonset import DAEMONSETS, REVISION_HASH
from tfusion.embedded.workloads.revisions import CONTROLLER_REVISIONS
from tfusion.embedded.workloads.statefulset import POD_NAME, STATEFULSETS
from tfusion.kube import resources as r
from tfusion.kube.client import Invalid, KubeClient, NotFound
from tfusion.kube.manager import Manager
from tfusion.kube.resources import ApiResource

pytestmark = pytest.mark.anyio
NODE = "n1"
NS = "default"


def controllers(manager: Manager) -> None:
    WorkloadControllers(manager)
    VolumeBinder(manager)


@pytest.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[KubeClient]:
    """A Manager running the workload controllers and the volume binder, and a simulated kubelet for node n1."""
    async with simulated_node(kube, NODE, controllers) as client:
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

    def __init__(self, selector: str = "app=db") -> None:
        self.selector = selector
        self.seen: list[tuple[str, str]] = []

    async def follow(self, kube: KubeClient, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        start = (await kube.list(r.PODS, namespace=NS)).resource_version
        task_status.started()
        async with contextlib.aclosing(kube.watch(r.PODS, namespace=NS, label_selector=self.selector,
                                                  resource_version=start)) as events:
            async for kind, pod in events:
                self._note(kind, pod)

    def _note(self, kind: str, pod: dict[str, Any]) -> None:
        assert kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"), (kind, pod)
        if kind == "BOOKMARK":
            return
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


# ------------------------------------------------------------------ ControllerRevisions and rollout
async def kubectl(apiserver: Any, cache: Path, *args: str) -> str:
    """The real kubectl on the test's API server; its stdout (a failure shows stderr)."""
    command = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "--cache-dir", str(cache), *args]
    done = await anyio.run_process(command, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.decode()}"
    return done.stdout.decode()


async def revisions_of(kube: KubeClient, owner: str) -> dict[int, dict[str, Any]]:
    """The owner's ControllerRevisions by revision number."""
    found = (await kube.list(CONTROLLER_REVISIONS, namespace=NS)).items
    return {rev["revision"]: rev for rev in found if rev["metadata"]["ownerReferences"][0]["name"] == owner}


async def set_image(kube: KubeClient, resource: ApiResource, name: str, image: str) -> int:
    """Change the template's image; the set's new generation."""
    changed = await kube.patch(resource, name, {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": image}]}}}}, namespace=NS, patch_type="strategic")
    return int(changed["metadata"]["generation"])


@needs_kubectl
async def test_daemonset_history_and_undo_through_kubectl(cluster: KubeClient, apiserver: Any,
                                                           tmp_path: Path) -> None:
    kube = cluster
    created = await kube.create(DAEMONSETS, daemonset(), namespace=NS)
    await eventually(lambda: _one_ready(kube, "busybox:1.36"), 15, what="the first pod")
    await set_image(kube, DAEMONSETS, "agent", "busybox:1.37")
    second = await eventually(lambda: _one_ready(kube, "busybox:1.37"), 15, what="the second template's pod")
    history = await revisions_of(kube, "agent")
    assert sorted(history) == [1, 2]
    newest = history[2]
    pod_hash = second["metadata"]["labels"][REVISION_HASH]
    assert newest["metadata"]["name"] == f"agent-{pod_hash}"
    assert newest["metadata"]["labels"] == {"app": "agent", REVISION_HASH: pod_hash}
    ref = newest["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("DaemonSet", created["metadata"]["uid"], True)
    assert newest["data"]["spec"]["template"]["$patch"] == "replace"
    assert newest["data"]["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:1.37"

    cache = tmp_path / "kubectl-cache"
    listed = (await kubectl(apiserver, cache, "rollout", "history", "ds/agent", "-n", NS)).splitlines()
    assert [line.split()[0] for line in listed[2:] if line.strip()] == ["1", "2"], listed
    first = await kubectl(apiserver, cache, "rollout", "history", "ds/agent", "-n", NS, "--revision=1")
    assert "busybox:1.36" in first and "busybox:1.37" not in first
    undone = await kubectl(apiserver, cache, "rollout", "undo", "ds/agent", "-n", NS)
    assert "rolled back" in undone
    back = await eventually(lambda: _one_ready(kube, "busybox:1.36"), 15, what="the pod of revision 1 again")
    # going back moves the old template's revision to the top instead of making a third
    history = await revisions_of(kube, "agent")
    assert sorted(history) == [2, 3]
    assert history[3]["metadata"]["labels"][REVISION_HASH] == back["metadata"]["labels"][REVISION_HASH]
    listed = (await kubectl(apiserver, cache, "rollout", "history", "ds/agent", "-n", NS)).splitlines()
    assert [line.split()[0] for line in listed[2:] if line.strip()] == ["2", "3"], listed


async def test_unused_revisions_beyond_the_history_limit_are_pruned(cluster: KubeClient) -> None:
    kube = cluster
    body = daemonset()
    body["spec"]["revisionHistoryLimit"] = 1
    await kube.create(DAEMONSETS, body, namespace=NS)
    await eventually(lambda: _one_ready(kube, "busybox:1.36"), 15, what="the first pod")
    await set_image(kube, DAEMONSETS, "agent", "busybox:1.37")
    await eventually(lambda: _one_ready(kube, "busybox:1.37"), 15, what="the second pod")
    await set_image(kube, DAEMONSETS, "agent", "busybox:1.38")
    await eventually(lambda: _one_ready(kube, "busybox:1.38"), 15, what="the third pod")

    async def pruned() -> dict[int, dict[str, Any]] | None:
        found = await revisions_of(kube, "agent")
        return found if sorted(found) == [2, 3] else None

    # the current revision and one unused one (the newest of those) stay
    kept = await eventually(pruned, 15, what="revision 1 pruned")
    assert kept[3]["data"]["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:1.38"


@needs_kubectl
async def test_statefulset_revisions_status_and_kubectl_history(cluster: KubeClient, apiserver: Any,
                                                                tmp_path: Path) -> None:
    kube = cluster
    await kube.create(STATEFULSETS, statefulset(2), namespace=NS)
    first = await eventually(lambda: _sts_status(kube, ready=2), 20, what="readyReplicas 2")
    assert first["currentRevision"] == first["updateRevision"]
    generation = await set_image(kube, STATEFULSETS, "db", "busybox:1.37")

    async def rolled() -> dict[str, Any] | None:
        status = await _sts_status(kube, ready=2)
        return status if status and status["observedGeneration"] == generation and \
            status["updatedReplicas"] == 2 and status["currentRevision"] == status["updateRevision"] else None

    second = await eventually(rolled, 30, what="both pods on the new template")
    assert second["updateRevision"] != first["updateRevision"]
    history = await revisions_of(kube, "db")
    assert [history[n]["metadata"]["name"] for n in sorted(history)] == [first["updateRevision"],
                                                                         second["updateRevision"]]
    # a StatefulSet's pods carry the whole revision name
    assert {p["metadata"]["labels"][REVISION_HASH] for p in await live_pods(kube, "db")} == \
        {second["updateRevision"]}
    listed = (await kubectl(apiserver, tmp_path / "cache", "rollout", "history", "sts/db", "-n", NS)).splitlines()
    assert [line.split()[0] for line in listed[2:] if line.strip()] == ["1", "2"], listed


# ------------------------------------------------------------------ DaemonSet maxSurge
def surging_daemonset() -> dict[str, Any]:
    body = daemonset()
    body["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return body


async def test_a_surging_daemonset_starts_the_new_pod_before_the_old_one_goes(cluster: KubeClient) -> None:
    kube = cluster
    log = PodLog("app=agent")
    await kube.create(DAEMONSETS, surging_daemonset(), namespace=NS)
    old = await eventually(lambda: _one_ready(kube, "busybox:1.36"), 15, what="the first pod")
    async with anyio.create_task_group() as tg:
        await tg.start(log.follow, kube)
        await set_image(kube, DAEMONSETS, "agent", "busybox:1.37")
        new = await eventually(lambda: _one_ready(kube, "busybox:1.37"), 15, what="the surged pod alone")
        await eventually(lambda: ("deleted", old["metadata"]["name"]) in log.seen, 10, what="the old pod's DELETED")
        tg.cancel_scope.cancel()
    # the node never lacked a ready pod: the new one was Ready before the old one began to go
    assert log.at("ready", new["metadata"]["name"]) < log.first_gone(old["metadata"]["name"]), log.seen


@pytest.mark.parametrize(("rolling", "field", "words"), [
    ({"maxSurge": 1}, "spec.updateStrategy.rollingUpdate.maxSurge", "may not be set when maxUnavailable is non-zero"),
    ({"maxSurge": 0, "maxUnavailable": 0}, "spec.updateStrategy.rollingUpdate.maxUnavailable",
     "cannot be 0 when maxSurge is 0"),
    ({"maxSurge": "150%", "maxUnavailable": 0}, "spec.updateStrategy.rollingUpdate.maxSurge",
     "must not be greater than 100%"),
    ({"maxSurge": "lots", "maxUnavailable": 0}, "spec.updateStrategy.rollingUpdate.maxSurge", "lots"),
])
async def test_the_api_server_refuses_daemonset_surge_settings_kube_refuses(
        kube: KubeClient, rolling: dict[str, Any], field: str, words: str) -> None:
    body = daemonset()
    body["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": rolling}
    with pytest.raises(Invalid) as refused:
        await kube.create(DAEMONSETS, body, namespace=NS)
    assert refused.value.code == 422
    assert field in str(refused.value) and words in str(refused.value), str(refused.value)


# ------------------------------------------------------------------ StatefulSet volumeClaimTemplates
CLAIM_SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}


def claimed_statefulset(replicas: int, **retention: str) -> dict[str, Any]:
    body = statefulset(replicas, volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": CLAIM_SPEC}])
    if retention:
        body["spec"]["persistentVolumeClaimRetentionPolicy"] = retention
    return body


async def claim(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(PVCS, name, namespace=NS)
    except NotFound:
        return None


async def test_statefulset_pods_get_bound_claims_that_outlive_a_scale_down(cluster: KubeClient) -> None:
    kube = cluster
    created = await kube.create(STATEFULSETS, claimed_statefulset(2), namespace=NS)
    assert created["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain",
                                                                       "whenScaled": "Retain"}
    await eventually(lambda: _sts_status(kube, ready=2), 20, what="readyReplicas 2")
    pods = {p["metadata"]["name"]: p for p in await live_pods(kube, "db")}
    for ordinal in (0, 1):
        volumes = pods[f"db-{ordinal}"]["spec"]["volumes"]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": f"data-db-{ordinal}"}} in volumes

    async def bound(name: str) -> dict[str, Any] | None:
        found = await claim(kube, name)
        return found if found and found.get("status", {}).get("phase") == "Bound" else None

    first = await eventually(lambda: bound("data-db-1"), 15, what="data-db-1 Bound")
    assert first["status"]["capacity"] == {"storage": "1Gi"}
    assert first["metadata"]["labels"] == {"app": "db"} and "ownerReferences" not in first["metadata"]
    assert first["spec"]["volumeMode"] == "Filesystem"

    await kube.patch(STATEFULSETS, "db", {"spec": {"replicas": 1}}, namespace=NS)
    await eventually(lambda: _sts_status(kube, ready=1, replicas=1), 20, what="scaled to 1")
    kept = await claim(kube, "data-db-1")  # Retain: the claim of the removed ordinal stays
    assert kept is not None and kept["metadata"]["uid"] == first["metadata"]["uid"]


async def test_claims_go_with_their_pod_or_set_when_the_policy_says_delete(cluster: KubeClient) -> None:
    kube = cluster
    sts = await kube.create(STATEFULSETS, claimed_statefulset(2, whenDeleted="Delete", whenScaled="Delete"),
                            namespace=NS)
    await eventually(lambda: _sts_status(kube, ready=2), 20, what="readyReplicas 2")
    kept = await claim(kube, "data-db-0")
    assert kept is not None
    assert [(ref["kind"], ref["uid"]) for ref in kept["metadata"]["ownerReferences"]] == \
        [("StatefulSet", sts["metadata"]["uid"])]

    await kube.patch(STATEFULSETS, "db", {"spec": {"replicas": 1}}, namespace=NS)
    await eventually(lambda: _gone(kube, "data-db-1"), 20, what="data-db-1 deleted with its pod")
    assert await claim(kube, "data-db-0") is not None
    await kube.delete(STATEFULSETS, "db", namespace=NS)
    await eventually(lambda: _gone(kube, "data-db-0"), 20, what="data-db-0 deleted with the set")


async def _gone(kube: KubeClient, name: str) -> bool | None:
    return True if await claim(kube, name) is None else None


@pytest.mark.parametrize(("spec", "field"), [
    ({"resources": {"requests": {"storage": "1Gi"}}}, "spec.accessModes"),
    ({"accessModes": ["ReadWriteSometimes"], "resources": {"requests": {"storage": "1Gi"}}}, "spec.accessModes"),
    ({"accessModes": ["ReadWriteOnce"]}, "spec.resources[storage]"),
    ({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "0"}}}, "spec.resources[storage]"),
    ({**CLAIM_SPEC, "volumeMode": "Tape"}, "spec.volumeMode"),
])
async def test_the_api_server_refuses_claims_kube_refuses(kube: KubeClient, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as refused:
        await kube.create(PVCS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                 "metadata": {"name": "bad"}, "spec": spec}, namespace=NS)
    assert refused.value.code == 422 and field in str(refused.value), str(refused.value)


async def test_a_claim_may_grow_but_not_shrink_or_change_modes(kube: KubeClient) -> None:
    made = await kube.create(PVCS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
                                    "spec": CLAIM_SPEC}, namespace=NS)
    assert made["status"] == {"phase": "Pending"}  # no binder runs in this test
    grown = await kube.patch(PVCS, "c", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, namespace=NS)
    assert grown["spec"]["resources"]["requests"]["storage"] == "2Gi"
    with pytest.raises(Invalid) as refused:
        await kube.patch(PVCS, "c", {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}, namespace=NS)
    assert "spec.resources.requests.storage" in str(refused.value)
    with pytest.raises(Invalid) as refused:
        await kube.patch(PVCS, "c", {"spec": {"accessModes": ["ReadWriteMany"]}}, namespace=NS)
    assert "spec is immutable after creation" in str(refused.value)


async def test_the_api_server_refuses_bad_claim_templates_and_retention(kube: KubeClient) -> None:
    body = claimed_statefulset(1, whenDeleted="Sometimes", whenScaled="Retain")
    body["spec"]["volumeClaimTemplates"].append({"metadata": {"name": "logs"}, "spec": {"accessModes": []}})
    with pytest.raises(Invalid) as refused:
        await kube.create(STATEFULSETS, body, namespace=NS)
    message = str(refused.value)
    assert "spec.persistentVolumeClaimRetentionPolicy.whenDeleted" in message
    assert "spec.volumeClaimTemplates[1].spec.accessModes" in message


@needs_kubectl
async def test_kubectl_undoes_a_statefulset_and_lists_its_revisions_and_claims(cluster: KubeClient, apiserver: Any,
                                                                              tmp_path: Path) -> None:
    kube = cluster
    cache = tmp_path / "kubectl-cache"
    await kube.create(STATEFULSETS, claimed_statefulset(1), namespace=NS)
    first = await eventually(lambda: _sts_status(kube, ready=1), 20, what="readyReplicas 1")
    generation = await set_image(kube, STATEFULSETS, "db", "busybox:1.37")

    async def on(revision: str | None, generation: int) -> dict[str, Any] | None:
        status = await _sts_status(kube, ready=1)
        if not status or status["observedGeneration"] != generation or status["updatedReplicas"] != 1:
            return None
        return status if revision is None or status["updateRevision"] == revision else None

    second = await eventually(lambda: on(None, generation), 30, what="the pod on the new template")
    table = (await kubectl(apiserver, cache, "get", "controllerrevisions", "-n", NS)).splitlines()
    assert table[0].split() == ["NAME", "CONTROLLER", "REVISION", "AGE"]
    assert sorted(line.split()[:3] for line in table[1:]) == sorted(
        [[first["updateRevision"], "statefulset.apps/db", "1"], [second["updateRevision"], "statefulset.apps/db", "2"]])

    assert "rolled back" in await kubectl(apiserver, cache, "rollout", "undo", "sts/db", "-n", NS)
    generation = int((await kube.get(STATEFULSETS, "db", namespace=NS))["metadata"]["generation"])
    await eventually(lambda: on(first["updateRevision"], generation), 30, what="the pod back on revision 1's template")
    pods = await live_pods(kube, "db")
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["busybox:1.36"]

    claims = (await kubectl(apiserver, cache, "get", "pvc", "-n", NS)).splitlines()
    assert claims[0].split() == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS", "MODES", "STORAGECLASS",
                                 "VOLUMEATTRIBUTESCLASS", "AGE"]
    assert claims[1].split()[:4] == ["data-db-0", "Bound", "1Gi", "RWO"]
