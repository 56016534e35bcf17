"""apps/v1 Deployments and ReplicaSets and batch/v1 Jobs in the embedded API server: discovery,
defaults, validation (422s naming the field), the /scale subresource, tables, garbage collection,
and the real kubectl (apply, scale, get columns)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.kube import resources as r
from tfusion.kube.client import BadRequest, Invalid, KubeClient, NotFound

pytestmark = pytest.mark.anyio
LABELS = {"app": "web"}


def template(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": dict(LABELS if labels is None else labels)},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec}}


def deployment(name: str = "web", **spec: Any) -> dict[str, Any]:
    body = {"replicas": 2, "selector": {"matchLabels": dict(LABELS)}, "template": template(), **spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": body}


def replicaset(name: str = "web-rs", **spec: Any) -> dict[str, Any]:
    body = {"selector": {"matchLabels": dict(LABELS)}, "template": template(), **spec}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name}, "spec": body}


def job(name: str = "pi", **spec: Any) -> dict[str, Any]:
    body = {"template": template({}, restartPolicy="Never"), **spec}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": body}


def causes(exc: Invalid) -> list[str]:
    return [c["field"] for c in exc.status["details"]["causes"]]


async def test_discovery_lists_the_workload_kinds(apiserver: Any) -> None:
    async with apiserver.http() as http:
        apps = (await http.get("/apis/apps/v1")).json()
        batch = (await http.get("/apis/batch/v1")).json()
        groups = {g["name"] for g in (await http.get("/apis")).json()["groups"]}
    by_name = {res["name"]: res for res in apps["resources"]}
    assert {"apps", "batch"} <= groups
    assert by_name["deployments"]["shortNames"] == ["deploy"] and by_name["deployments"]["namespaced"] is True
    assert by_name["replicasets"]["shortNames"] == ["rs"]
    assert "deployments/status" in by_name and "replicasets/status" in by_name
    scale = by_name["deployments/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    assert set(scale["verbs"]) == {"get", "patch", "update"}
    assert {res["name"] for res in batch["resources"]} == {"jobs", "jobs/status", "cronjobs", "cronjobs/status"}


async def test_deployment_defaults(kube: KubeClient) -> None:
    created = await kube.create(r.DEPLOYMENTS, deployment(replicas=None), namespace="default")
    spec = created["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    assert spec["revisionHistoryLimit"] == 10 and spec["progressDeadlineSeconds"] == 600
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Always" and pod_spec["dnsPolicy"] == "ClusterFirst"
    assert pod_spec["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert "serviceAccountName" not in pod_spec  # a pod default, not a template default
    assert created["metadata"]["generation"] == 1
    updated = await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 3}}, namespace="default")
    assert updated["metadata"]["generation"] == 2
    status = await kube.patch(r.DEPLOYMENTS, "web", {"status": {"replicas": 3}}, namespace="default",
                              subresource="status")
    assert status["metadata"]["generation"] == 2 and status["status"]["replicas"] == 3
    recreate = await kube.create(r.DEPLOYMENTS, deployment("re", strategy={"type": "Recreate"}), namespace="default")
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"selector": None}, "spec.selector"),
        ({"selector": {"matchLabels": {"app": "other"}}}, "spec.template.metadata.labels"),
        ({"selector": {}}, "spec.selector"),
        ({"replicas": -1}, "spec.replicas"),
        ({"template": template(restartPolicy="Never")}, "spec.template.spec.restartPolicy"),
        ({"template": {"metadata": {"labels": LABELS}, "spec": {"containers": []}}}, "spec.template.spec.containers"),
        ({"strategy": {"type": "Blue"}}, "spec.strategy.type"),
        ({"strategy": {"type": "Recreate", "rollingUpdate": {}}}, "spec.strategy.rollingUpdate"),
        ({"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}},
         "spec.strategy.rollingUpdate.maxUnavailable"),
        ({"strategy": {"rollingUpdate": {"maxSurge": "ten"}}}, "spec.strategy.rollingUpdate.maxSurge"),
        ({"progressDeadlineSeconds": 5, "minReadySeconds": 10}, "spec.progressDeadlineSeconds"),
        ({"template": template({"app": "web", "bad key!": "x"})}, "spec.template.metadata.labels"),
    ],
)
async def test_deployment_validation(kube: KubeClient, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        await kube.create(r.DEPLOYMENTS, deployment(**spec), namespace="default")
    assert caught.value.code == 422
    assert field in causes(caught.value), caught.value.status


async def test_wrong_json_types_are_400_naming_the_field(kube: KubeClient) -> None:
    for body, path in ((deployment(replicas="3"), "spec.replicas"),
                       (deployment(template={"spec": {"containers": 5}}), "spec.template.spec.containers"),
                       (job(backoffLimit=True), "spec.backoffLimit"),
                       (replicaset(selector={"matchLabels": ["x"]}), "spec.selector.matchLabels")):
        resource = {"Deployment": r.DEPLOYMENTS, "Job": r.JOBS, "ReplicaSet": r.REPLICASETS}[body["kind"]]
        with pytest.raises(BadRequest) as caught:
            await kube.create(resource, body, namespace="default")
        assert path in str(caught.value), caught.value


async def test_selector_is_immutable(kube: KubeClient) -> None:
    await kube.create(r.DEPLOYMENTS, deployment(), namespace="default")
    change = {"spec": {"selector": {"matchLabels": {"app": "web", "tier": "x"}},
                       "template": {"metadata": {"labels": {"app": "web", "tier": "x"}}}}}
    with pytest.raises(Invalid) as caught:
        await kube.patch(r.DEPLOYMENTS, "web", change, namespace="default")
    assert causes(caught.value) == ["spec.selector"] and "field is immutable" in str(caught.value)


async def test_replicaset_defaults_and_validation(kube: KubeClient) -> None:
    created = await kube.create(r.REPLICASETS, replicaset(), namespace="default")
    assert created["spec"]["replicas"] == 1 and created["metadata"]["generation"] == 1
    with pytest.raises(Invalid) as caught:
        await kube.create(r.REPLICASETS, replicaset("bad", selector={"matchLabels": {"app": "x"}}),
                          namespace="default")
    assert causes(caught.value) == ["spec.template.metadata.labels"]


async def test_job_defaults_and_generated_selector(kube: KubeClient) -> None:
    created = await kube.create(r.JOBS, job(), namespace="default")
    uid = created["metadata"]["uid"]
    spec = created["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = spec["template"]["metadata"]["labels"]
    assert labels == {"controller-uid": uid, "batch.kubernetes.io/controller-uid": uid,
                      "job-name": "pi", "batch.kubernetes.io/job-name": "pi"}
    assert created["metadata"]["labels"] == labels  # a Job without labels takes its template's
    only_parallel = await kube.create(r.JOBS, job("par", parallelism=3), namespace="default")
    assert "completions" not in only_parallel["spec"] and only_parallel["spec"]["parallelism"] == 3
    # a client-sent uid is the server's to choose, and the selector follows the real one
    sneaky = job("sneaky")
    sneaky["metadata"]["uid"] = "0000"
    stored = await kube.create(r.JOBS, sneaky, namespace="default")
    assert stored["metadata"]["uid"] != "0000"
    assert stored["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"] == \
        stored["metadata"]["uid"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"template": template({})}, "spec.template.spec.restartPolicy"),
        ({"backoffLimit": -1}, "spec.backoffLimit"),
        ({"completions": -2}, "spec.completions"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
        ({"manualSelector": True}, "spec.selector"),
        ({"selector": {"matchLabels": {"app": "web"}}}, "spec.template.metadata.labels"),
    ],
)
async def test_job_validation(kube: KubeClient, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        await kube.create(r.JOBS, job(**spec), namespace="default")
    assert field in causes(caught.value), caught.value.status


async def test_job_template_is_immutable(kube: KubeClient) -> None:
    await kube.create(r.JOBS, job(), namespace="default")
    with pytest.raises(Invalid) as caught:
        await kube.patch(r.JOBS, "pi", {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "busybox:1.37"}]}}}}, namespace="default")
    assert "spec.template" in causes(caught.value)
    changed = await kube.patch(r.JOBS, "pi", {"spec": {"parallelism": 2}}, namespace="default")
    assert changed["spec"]["parallelism"] == 2


async def test_scale_subresource(kube: KubeClient) -> None:
    await kube.create(r.DEPLOYMENTS, deployment(), namespace="default")
    scale = await kube.get(r.DEPLOYMENTS, "web", namespace="default", subresource="scale")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 0, "selector": "app=web"}
    patched = await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 5}}, namespace="default",
                               subresource="scale")
    assert patched["spec"]["replicas"] == 5
    parent = await kube.get(r.DEPLOYMENTS, "web", namespace="default")
    assert parent["spec"]["replicas"] == 5 and parent["metadata"]["generation"] == 2
    replaced = await kube.replace(r.DEPLOYMENTS, {**patched, "spec": {"replicas": 1}}, namespace="default",
                                  subresource="scale")
    assert replaced["spec"]["replicas"] == 1
    from tfusion.kube.client import Conflict

    with pytest.raises(Conflict):  # the Scale's resourceVersion is the parent's: a stale one is refused
        await kube.replace(r.DEPLOYMENTS, {**patched, "spec": {"replicas": 4}}, namespace="default",
                           subresource="scale")
    with pytest.raises(Invalid) as caught:
        await kube.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": -1}}, namespace="default", subresource="scale")
    assert causes(caught.value) == ["spec.replicas"]
    await kube.create(r.REPLICASETS, replicaset(), namespace="default")
    rs_scale = await kube.patch(r.REPLICASETS, "web-rs", {"spec": {"replicas": 0}}, namespace="default",
                                subresource="scale")
    assert rs_scale["spec"]["replicas"] == 0
    with pytest.raises(NotFound):
        await kube.get(r.JOBS, "nothing", namespace="default", subresource="scale")


def _owned(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]}


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
async def test_deleting_a_deployment_cascades(kube: KubeClient, policy: str) -> None:
    deploy = await kube.create(r.DEPLOYMENTS, deployment(), namespace="default")
    rs = replicaset("web-1")
    rs["metadata"].update(_owned(deploy))
    rs = await kube.create(r.REPLICASETS, rs, namespace="default")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1-a", "labels": LABELS, **_owned(rs)},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    await kube.create(r.PODS, pod, namespace="default")
    await kube.delete(r.DEPLOYMENTS, "web", namespace="default", propagation_policy=policy)

    async def all_gone() -> bool:
        for resource, name in ((r.DEPLOYMENTS, "web"), (r.REPLICASETS, "web-1"), (r.PODS, "web-1-a")):
            try:
                await kube.get(resource, name, namespace="default")
                return False
            except NotFound:
                pass
        return True

    await eventually(all_gone)


async def test_tables(apiserver: Any, kube: KubeClient) -> None:
    await kube.create(r.DEPLOYMENTS, deployment(), namespace="default")
    await kube.patch(r.DEPLOYMENTS, "web", {"status": {"readyReplicas": 1, "updatedReplicas": 2,
                                                       "availableReplicas": 1}},
                     namespace="default", subresource="status")
    await kube.create(r.JOBS, job(), namespace="default")
    accept = {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    async with apiserver.http() as http:
        deploy = (await http.get("/apis/apps/v1/namespaces/default/deployments", headers=accept)).json()
        jobs = (await http.get("/apis/batch/v1/namespaces/default/jobs", headers=accept)).json()
    names = [c["name"] for c in deploy["columnDefinitions"]]
    assert names == ["Name", "Ready", "Up-to-date", "Available", "Age", "Containers", "Images", "Selector"]
    assert deploy["rows"][0]["cells"][:4] == ["web", "1/2", 2, 1]
    assert deploy["rows"][0]["cells"][5:] == ["main", "busybox:1.36", "app=web"]
    assert [c["priority"] for c in deploy["columnDefinitions"]][5:] == [1, 1, 1]
    assert [c["name"] for c in jobs["columnDefinitions"]][:4] == ["Name", "Status", "Completions", "Duration"]
    assert jobs["rows"][0]["cells"][:4] == ["pi", "Running", "0/1", ""]


# ------------------------------------------------------------------------------------ kubectl
def kubectl(apiserver: Any, tmp: Path, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp / "cache"),
                             *args], capture_output=True, text=True, input=stdin, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


@needs_kubectl
def test_kubectl_apply_scale_get(apiserver: Any, tmp_path: Path) -> None:
    manifest = json.dumps(deployment())
    assert "deployment.apps/web created" in kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=manifest)
    assert "unchanged" in kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=manifest)
    changed = deployment()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:1.37"
    assert "configured" in kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=json.dumps(changed))
    assert "deployment.apps/web scaled" in kubectl(apiserver, tmp_path, "scale", "deploy/web", "--replicas=4")
    got = json.loads(kubectl(apiserver, tmp_path, "get", "deploy", "web", "-o", "json"))
    assert got["spec"]["replicas"] == 4 and got["metadata"]["generation"] == 3
    assert got["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:1.37"
    table = kubectl(apiserver, tmp_path, "get", "deploy,rs,jobs")
    assert table.split("\n")[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert table.split("\n")[1].split()[:4] == ["deployment.apps/web", "0/4", "0", "0"]
    wide = kubectl(apiserver, tmp_path, "get", "deploy", "-o", "wide").split("\n")[0].split()
    assert wide == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    bad = subprocess.run([KUBECTL, "--kubeconfig", apiserver.kubeconfig, "--cache-dir", str(tmp_path / "cache"),
                          "apply", "-f", "-"], input=json.dumps(deployment("bad", selector={"matchLabels": {
                              "app": "nope"}})), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "spec.template.metadata.labels" in bad.stderr
    assert "deployment.apps/typed created" in kubectl(apiserver, tmp_path, "create", "deployment", "typed",
                                                      "--image=busybox:1", "--replicas=2", "--port=80")
    typed = json.loads(kubectl(apiserver, tmp_path, "get", "deploy", "typed", "-o", "json"))["spec"]
    assert typed["replicas"] == 2 and typed["selector"] == {"matchLabels": {"app": "typed"}}
    assert typed["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 80
    assert "hostPort" not in typed["template"]["spec"]["containers"][0]["ports"][0]
    assert "job.batch/typed created" in kubectl(apiserver, tmp_path, "create", "job", "typed", "--image=busybox",
                                                "--", "echo", "hi")
    typed_job = json.loads(kubectl(apiserver, tmp_path, "get", "job", "typed", "-o", "json"))["spec"]
    assert typed_job["template"]["spec"]["containers"][0]["command"] == ["echo", "hi"]
    assert typed_job["template"]["spec"]["restartPolicy"] == "Never"
    job_manifest = json.dumps(job())
    assert "job.batch/pi created" in kubectl(apiserver, tmp_path, "apply", "-f", "-", stdin=job_manifest)
    jobs = kubectl(apiserver, tmp_path, "get", "jobs").split("\n")[0].split()
    assert jobs == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
