"""The Deployment, ReplicaSet and Job controllers of --role=all, in-process with a Manager and the
simulated kubelet, against the embedded API server over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.one_box import simulated_node
from tfusion.embedded.workloads import POD_TEMPLATE_HASH, REVISION, WorkloadControllers, template_hash
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound

pytestmark = pytest.mark.anyio
T = TypeVar("T")
NODE = "n1"
NS = "default"
EXIT = "tfusion.dev/simulate-exit-after"
EXIT_CODE = "tfusion.dev/simulate-exit-code"


@pytest.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[KubeClient]:
    """A Manager running the workload controllers and a simulated kubelet for node n1."""
    async with simulated_node(kube, NODE, WorkloadControllers) as client:
        yield client


def pod_template(image: str = "busybox:1.36", annotations: dict[str, str] | None = None,
                 **spec: Any) -> dict[str, Any]:
    # no scheduler runs here: the template binds its pods to the simulated kubelet's node
    meta: dict[str, Any] = {"labels": {"app": "web"}}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": image}], **spec}}


def deployment(replicas: int = 3, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}, "template": pod_template(),
                     **spec}}


async def pods_of(kube: KubeClient, label: str = "app=web") -> list[dict[str, Any]]:
    return [p for p in (await kube.list(r.PODS, namespace=NS, label_selector=label)).items
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def rollout_done(kube: KubeClient, replicas: int, image: str) -> dict[str, Any] | None:
    """What `kubectl rollout status` waits for, plus: exactly `replicas` ready pods, all of `image`."""
    deploy = await kube.get(r.DEPLOYMENTS, "web", namespace=NS)
    status = deploy.get("status") or {}
    if status.get("observedGeneration") != deploy["metadata"]["generation"]:
        return None
    if (status.get("updatedReplicas"), status.get("replicas"), status.get("availableReplicas")) != \
            (replicas, replicas, replicas):
        return None
    pods = await pods_of(kube)
    if len(pods) != replicas or not all(ready(p) and p["spec"]["containers"][0]["image"] == image for p in pods):
        return None
    return deploy


async def test_deployment_reaches_ready_pods_owned_by_one_replicaset(cluster: KubeClient) -> None:
    kube = cluster
    created = await kube.create(r.DEPLOYMENTS, deployment(), namespace=NS)
    deploy = await eventually(lambda: rollout_done(kube, 3, "busybox:1.36"), 15, what="3 ready pods")
    sets = (await kube.list(r.REPLICASETS, namespace=NS)).items
    assert len(sets) == 1
    rs = sets[0]
    pod_hash = template_hash(created["spec"]["template"])
    assert rs["metadata"]["name"] == f"web-{pod_hash}" and rs["metadata"]["labels"][POD_TEMPLATE_HASH] == pod_hash
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", POD_TEMPLATE_HASH: pod_hash}
    owner = rs["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == \
        ("Deployment", "web", created["metadata"]["uid"], True, True)
    assert rs["metadata"]["annotations"][REVISION] == "1" and deploy["metadata"]["annotations"][REVISION] == "1"
    for pod in await pods_of(kube):
        assert pod["metadata"]["name"].startswith(f"web-{pod_hash}-")
        assert pod["metadata"]["labels"] == {"app": "web", POD_TEMPLATE_HASH: pod_hash}
        ref = pod["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == \
            ("ReplicaSet", rs["metadata"]["uid"], True, True)

    async def rs_status() -> dict[str, Any] | None:
        found = await kube.get(r.REPLICASETS, rs["metadata"]["name"], namespace=NS)
        return found["status"] if found["status"].get("availableReplicas") == 3 else None

    status = await eventually(rs_status, 15, what="ReplicaSet status")
    assert status["replicas"] == status["readyReplicas"] == status["fullyLabeledReplicas"] == 3
    assert status["observedGeneration"] == 1
    conditions = {c["type"]: c for c in deploy["status"]["conditions"]}
    assert conditions["Available"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "NewReplicaSetAvailable"


@pytest.mark.parametrize("strategy", [{"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1,
                                                                                  "maxUnavailable": 0}},
                                      {"type": "Recreate"}])
async def test_template_change_rolls_to_a_new_replicaset(cluster: KubeClient, strategy: dict[str, Any]) -> None:
    kube = cluster
    await kube.create(r.DEPLOYMENTS, deployment(strategy=strategy), namespace=NS)
    await eventually(lambda: rollout_done(kube, 3, "busybox:1.36"), 15, what="first rollout")
    seen_total: list[int] = []
    await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "image": "busybox:1.37"}]}}}}, namespace=NS)

    async def rolled() -> dict[str, Any] | None:
        seen_total.append(len(await pods_of(kube)))
        return await rollout_done(kube, 3, "busybox:1.37")

    deploy = await eventually(rolled, 15, what="second rollout")
    assert deploy["metadata"]["annotations"][REVISION] == "2"
    sets = {rs["metadata"]["annotations"][REVISION]: rs for rs in (await kube.list(r.REPLICASETS, namespace=NS)).items}
    assert sets["1"]["spec"]["replicas"] == 0 and sets["2"]["spec"]["replicas"] == 3
    if strategy["type"] == "RollingUpdate":  # maxSurge 1: never more than 4 pods at once
        assert max(seen_total) <= 4, seen_total


async def test_scale_down_and_up(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.DEPLOYMENTS, deployment(), namespace=NS)
    await eventually(lambda: rollout_done(kube, 3, "busybox:1.36"), 15, what="3 pods")
    await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 1}}, namespace=NS, subresource="scale")
    await eventually(lambda: rollout_done(kube, 1, "busybox:1.36"), 15, what="1 pod")
    await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 2}}, namespace=NS)
    await eventually(lambda: rollout_done(kube, 2, "busybox:1.36"), 15, what="2 pods")
    assert len((await kube.list(r.REPLICASETS, namespace=NS)).items) == 1


async def test_replicaset_replaces_a_deleted_pod(cluster: KubeClient) -> None:
    kube = cluster
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "solo"},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": pod_template()}}
    await kube.create(r.REPLICASETS, rs, namespace=NS)

    async def two_ready() -> list[dict[str, Any]] | None:
        pods = await pods_of(kube)
        return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

    first = await eventually(two_ready, 15, what="2 ready pods")
    await kube.delete(r.PODS, first[0]["metadata"]["name"], namespace=NS)
    after = await eventually(two_ready, 15, what="a replacement pod")
    assert first[0]["metadata"]["name"] not in {p["metadata"]["name"] for p in after}


async def test_deleting_the_deployment_cascades(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.DEPLOYMENTS, deployment(replicas=2), namespace=NS)
    await eventually(lambda: rollout_done(kube, 2, "busybox:1.36"), 15, what="2 pods")
    await kube.delete(r.DEPLOYMENTS, "web", namespace=NS, propagation_policy="Foreground")

    async def gone() -> bool:
        try:
            await kube.get(r.DEPLOYMENTS, "web", namespace=NS)
            return False
        except NotFound:
            pass
        return not (await kube.list(r.REPLICASETS, namespace=NS)).items and not await pods_of(kube)

    await eventually(gone, 15, what="Deployment, ReplicaSet and pods gone")


def job(name: str, template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": template,
                                                                                         **spec}}


def job_template(restart: str = "Never", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"annotations": annotations},
            "spec": {"nodeName": NODE, "restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}]}}


async def finished_job(kube: KubeClient, name: str, condition: str) -> dict[str, Any] | None:
    found = await kube.get(r.JOBS, name, namespace=NS)
    conditions = {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}
    return found if conditions.get(condition) == "True" else None


async def test_job_completes(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, job("twice", job_template(**{EXIT: "300ms"}), completions=2), namespace=NS)
    done = await eventually(lambda: finished_job(kube, "twice", "Complete"), 15, what="Job Complete")
    status = done["status"]
    assert status["succeeded"] == 2 and status["active"] == 0 and status["failed"] == 0
    assert status["startTime"] and status["completionTime"]
    assert {c["type"] for c in status["conditions"]} >= {"SuccessCriteriaMet", "Complete"}
    pods = (await kube.list(r.PODS, namespace=NS, label_selector="job-name=twice")).items
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert all(p["metadata"]["name"].startswith("twice-") for p in pods)
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "Job" for p in pods)


async def test_job_with_failing_pods_hits_the_backoff_limit(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, job("fails", job_template(**{EXIT: "100ms", EXIT_CODE: "3"}), backoffLimit=1),
                      namespace=NS)
    failed = await eventually(lambda: finished_job(kube, "fails", "Failed"), 15, what="Job Failed")
    reasons = {c["type"]: c["reason"] for c in failed["status"]["conditions"]}
    assert reasons["Failed"] == reasons["FailureTarget"] == "BackoffLimitExceeded"
    assert failed["status"]["failed"] == 2 and failed["status"]["succeeded"] == 0
    await anyio.sleep(0.5)  # no pod is started after the Job failed
    pods = (await kube.list(r.PODS, namespace=NS, label_selector="job-name=fails")).items
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Failed"}
    assert pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


async def test_on_failure_restarts_count_against_the_backoff_limit(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, job("restarts", job_template("OnFailure", **{EXIT: "100ms", EXIT_CODE: "1"}),
                                  backoffLimit=2), namespace=NS)
    failed = await eventually(lambda: finished_job(kube, "restarts", "Failed"), 15, what="Job Failed")
    assert {c["type"]: c["reason"] for c in failed["status"]["conditions"]}["Failed"] == "BackoffLimitExceeded"


async def test_job_pods_without_the_annotation_keep_running(cluster: KubeClient) -> None:
    kube = cluster
    await kube.create(r.JOBS, job("forever", job_template(), parallelism=2, completions=4), namespace=NS)

    async def two_running() -> dict[str, Any] | None:
        found = await kube.get(r.JOBS, "forever", namespace=NS)
        return found if (found.get("status") or {}).get("ready") == 2 else None

    running = await eventually(two_running, 15, what="2 running pods")
    assert running["status"]["active"] == 2 and running["status"]["succeeded"] == 0
    assert not any(c["status"] == "True" for c in running["status"].get("conditions") or [])


@needs_kubectl
async def test_kubectl_apply_rollout_status_scale_get(cluster: KubeClient, apiserver: Any, tmp_path: Path) -> None:
    async def kubectl(*args: str, stdin: str | None = None) -> str:
        result = await anyio.run_process(
            [KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp_path / "cache"), *args],
            input=stdin.encode() if stdin else None, check=False)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout!r} {result.stderr!r}"
        return result.stdout.decode()

    assert "deployment.apps/web created" in await kubectl("apply", "-f", "-", stdin=json.dumps(deployment()))
    rolled = await kubectl("rollout", "status", "deploy/web", "--timeout=30s")
    assert 'deployment "web" successfully rolled out' in rolled
    text = await kubectl("get", "deploy,rs,pods")
    got = text.split("\n\n")
    deploy_lines, rs_lines, pod_lines = (block.strip().split("\n") for block in got[:3])
    assert deploy_lines[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert deploy_lines[1].split()[:4] == ["deployment.apps/web", "3/3", "3", "3"]
    assert rs_lines[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert rs_lines[1].split()[1:4] == ["3", "3", "3"] and rs_lines[1].startswith("replicaset.apps/web-")
    assert pod_lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert len(pod_lines) == 4 and all(line.split()[1:3] == ["1/1", "Running"] for line in pod_lines[1:])
    assert "scaled" in await kubectl("scale", "deploy/web", "--replicas=1")
    assert "successfully rolled out" in await kubectl("rollout", "status", "deploy/web", "--timeout=30s")
    await kubectl("set", "image", "deploy/web", "main=busybox:1.37")
    assert "successfully rolled out" in await kubectl("rollout", "status", "deploy/web", "--timeout=30s")
    history = await kubectl("rollout", "history", "deploy/web")
    assert "1 " in history and "2 " in history


async def test_progress_deadline_exceeded(cluster: KubeClient) -> None:
    kube = cluster
    stuck = deployment(replicas=1, progressDeadlineSeconds=1)
    del stuck["spec"]["template"]["spec"]["nodeName"]  # no scheduler here: its pod stays Pending
    await kube.create(r.DEPLOYMENTS, stuck, namespace=NS)

    async def timed_out() -> dict[str, Any] | None:
        found = await kube.get(r.DEPLOYMENTS, "web", namespace=NS)
        progressing: dict[str, Any] = next((c for c in (found.get("status") or {}).get("conditions") or []
                                            if c["type"] == "Progressing"), {})
        return found if progressing.get("reason") == "ProgressDeadlineExceeded" else None

    found = await eventually(timed_out, 15, what="ProgressDeadlineExceeded")
    conditions = {c["type"]: c for c in found["status"]["conditions"]}
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["Available"]["status"] == "False" and found["status"]["unavailableReplicas"] == 1
