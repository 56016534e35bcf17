"""`tfusion --role=all` as a newcomer runs it: one process, embedded API server, simulated GPUs.

Everything is checked from outside over HTTP (and kubectl where installed): the simulated kubelet's
Node, the GPUNode, the GPU objects the hypervisor reports, the hypervisor's and the controller's
APIs, a pod going Pending -> Running -> gone, a `kubectl run` pod scheduled and Running, SIGTERM,
and a restart on the same state that keeps what the user changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.kubectl import KUBECTL
from tests.helpers.role_all import NODE, POOL, TF, RoleAll, reported_gpus

EXPECTED_MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]


def check_cluster(run: RoleAll) -> list[str]:
    """What a fresh run must show; returns the GPU names."""
    node = run.get(f"/api/v1/nodes/{NODE}")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    assert node["status"]["allocatable"]["pods"] == "110"
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    lease = run.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}")
    assert lease["spec"]["holderIdentity"] == NODE

    gpunode = run.get(f"{TF}/gpunodes/{NODE}")
    assert gpunode["metadata"]["labels"]["tensor-fusion.ai/managed-by"] == POOL
    assert gpunode["metadata"]["labels"][f"tensor-fusion.ai/pool-{POOL}"] == "true"
    pool = run.get(f"{TF}/gpupools/{POOL}")
    assert pool["metadata"]["annotations"]["tensor-fusion.ai/is-default-pool"] == "true"

    gpus = run.wait_for("3 GPU objects, Running, with capacity", lambda: reported_gpus(run))
    assert [g["status"]["gpuModel"] for g in gpus] == EXPECTED_MODELS
    assert [g["status"]["capacity"]["tflops"] for g in gpus] == ["312", "312", "989"]
    assert all(g["metadata"]["labels"]["tensor-fusion.ai/gpupool"] == POOL for g in gpus)
    names = [g["metadata"]["name"] for g in gpus]
    run.wait_for("GPUNode Running with 3 GPUs", lambda: (lambda s: s.get("phase") == "Running"
                                                         and s.get("totalGPUs") == 3)(
        run.get(f"{TF}/gpunodes/{NODE}").get("status") or {}))

    devices = httpx.get(f"{run.hypervisor}/api/v1/devices", timeout=5).json()["data"]
    assert sorted(d["UUID"] for d in devices) == sorted(names)
    assert all(d["Healthy"] for d in devices)

    assert httpx.get(f"{run.controller}/readyz", timeout=5).status_code == 200
    allocation = httpx.get(f"{run.controller}/api/allocation", timeout=5)
    if allocation.status_code == 404:
        pytest.skip("the controller serves no /api/allocation yet (allocator service not attached)")
    run.wait_for("the allocator to hold the 3 GPUs", lambda: sorted(
        httpx.get(f"{run.controller}/api/allocation", timeout=5).json()["gpuStore"]) == sorted(names))
    return names


def check_kubectl(run: RoleAll, names: list[str]) -> None:
    if not Path(KUBECTL).exists():
        return
    out = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), "get", "gpus", "-o", "name"],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": str(run.tmp)})
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == sorted(f"gpu.tensor-fusion.ai/{n}" for n in names)


def check_pod_lifecycle(run: RoleAll) -> None:
    pods = f"{run.api}/api/v1/namespaces/default/pods"
    created = httpx.post(pods, timeout=5, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text
    pod = run.wait_for("the pod to run", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        run.get("/api/v1/namespaces/default/pods/hello")))
    assert pod["status"]["podIP"] == "127.0.0.1"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert httpx.delete(f"{pods}/hello", timeout=5, **run._api_auth()).status_code == 200
    auth = run._api_auth()
    run.wait_for("the pod to be gone", lambda: httpx.get(f"{pods}/hello", timeout=5, **auth).status_code == 404)


def check_plain_pod_runs(run: RoleAll) -> None:
    """`kubectl run` makes a pod naming no scheduler (default-scheduler): the built-in scheduler binds
    it to the simulated node, which runs it."""
    if not Path(KUBECTL).exists():
        return
    made = kubectl(run, "run", "plain", "--image=busybox", "--", "sleep", "3600")
    assert made.returncode == 0, made.stderr
    pod = run.wait_for("the plain pod to run", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        run.get("/api/v1/namespaces/default/pods/plain")))
    assert pod["spec"]["schedulerName"] == "default-scheduler" and pod["spec"]["nodeName"] == NODE
    assert kubectl(run, "delete", "pod", "plain", "--wait=false").returncode == 0


REPO = Path(__file__).resolve().parents[2]


def metric_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name)]


def check_a_manager_per_identity(run: RoleAll) -> None:
    """The controller and the hypervisor each run as their own ServiceAccount (--embedded-identities
    default), so each has a Manager of its own, as in a cluster: four KubeClients in the process
    (theirs, the embedded stage's admin one, and the controller's Lease's own); pod informers on
    exactly the selectors asked for (the controller's scheduler on every pod, its reconcilers on our
    pods, the hypervisor on its node's workers), none twice; and a registry per role that also
    serves the families only the others have. No request of theirs was refused."""
    controller = httpx.get(f"{run.controller}/metrics", timeout=5).text
    hypervisor = httpx.get(f"{run.hypervisor}/metrics", timeout=5).text
    for text in (controller, hypervisor):
        assert metric_lines(text, "tfusion_kube_clients ") == ["tfusion_kube_clients 4.0"]
    controller_pods = metric_lines(controller, 'tfusion_informer_objects{informer="pods')
    assert sorted(line.split('"')[1] for line in controller_pods) == [
        "pods", "pods labels=tensor-fusion.ai/component"], "every pod, and ours: each once"
    (hypervisor_pods,) = metric_lines(hypervisor, 'tfusion_informer_objects{informer="pods')
    assert f"fields=spec.nodeName={NODE}" in hypervisor_pods, "the hypervisor reads its own node's pods only"
    assert metric_lines(controller, "tfusion_leader ") == ["tfusion_leader 1.0"]
    # each role's /metrics still shows every family of the process (the others' mirrored)
    assert metric_lines(hypervisor, "tfusion_leader ") == ["tfusion_leader 1.0"]
    assert "as system:serviceaccount:tensor-fusion-sys:tensor-fusion-operator" in run.output()
    assert "as system:serviceaccount:tensor-fusion-sys:tensor-fusion-hypervisor-sa" in run.output()
    assert run.denials() == []


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, input=stdin, env={**os.environ, "HOME": str(run.tmp)})


def check_readme_commands(run: RoleAll) -> None:
    """The quick start's commands, as a newcomer pastes them: the examples and samples apply
    without touching the installation's defaults, and simulate-schedule places the example pod
    (no pool named, soft isolation by default) on a simulated GPU."""
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is not installed")
    cluster_before = run.get(f"{TF}/tensorfusionclusters/tensor-fusion")["spec"]
    template_before = run.get(f"{TF}/schedulingconfigtemplates/tf-scheduling-config")["spec"]
    for folder in ("deploy/examples", "deploy/samples"):
        applied = kubectl(run, "apply", "-f", str(REPO / folder))
        assert applied.returncode == 0, applied.stderr
    assert run.get(f"{TF}/tensorfusionclusters/tensor-fusion")["spec"] == cluster_before
    assert run.get(f"{TF}/schedulingconfigtemplates/tf-scheduling-config")["spec"] == template_before
    manifest = kubectl(run, "get", "pod", "my-pod", "-o", "yaml")
    assert manifest.returncode == 0, manifest.stderr
    answer = httpx.post(f"{run.controller}/api/simulate-schedule", content=manifest.stdout.encode(), timeout=10)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["scheduleResult"]["SuggestedHost"] == NODE, body
    assert body["error"] is None or not body["error"], body


def test_role_all_end_to_end(role_all: RoleAll) -> None:
    run = role_all
    run.start()
    run.wait_for("controller and hypervisor /readyz", run.ready)
    summary = run.wait_for("the startup summary", lambda: (lambda out: out if "Try:" in out else None)(run.output()))
    assert "tfusion is running" in summary and str(run.kubeconfig) in summary
    assert "3 GPU(s), simulated" in summary and "SIMULATED GPUs" in summary

    names = check_cluster(run)
    check_kubectl(run, names)
    check_pod_lifecycle(run)
    check_plain_pod_runs(run)
    check_a_manager_per_identity(run)
    check_readme_commands(run)

    # the user's changes to the defaults survive a restart
    auth = run._api_auth()
    patched = httpx.patch(f"{run.api}{TF}/gpupools/{POOL}", timeout=5, json={"metadata": {"labels": {"mine": "yes"}}},
                          headers={"Content-Type": "application/merge-patch+json", **auth["headers"]},
                          verify=auth["verify"])
    assert patched.status_code == 200, patched.text
    medium = f"{run.api}/apis/scheduling.k8s.io/v1/priorityclasses/tensor-fusion-medium"
    deleted = httpx.delete(medium, timeout=5, **run._api_auth())
    assert deleted.status_code == 200, deleted.text

    code, took = run.stop()
    assert code == 0, run.output()
    assert took < 5.0
    assert "released lease" in run.output()  # the controller let go of leadership before the API server closed

    run.start()  # same state: comes back, with the same GPUs and the user's changes
    run.wait_for("controller and hypervisor /readyz after the restart", run.ready)
    assert "CRDs: 0 created, 0 updated, 12 unchanged" in run.output()
    assert check_cluster(run) == names
    assert run.get(f"{TF}/gpupools/{POOL}")["metadata"]["labels"]["mine"] == "yes"
    missing = httpx.get(medium, timeout=5, **run._api_auth())
    assert missing.status_code == 404
    assert run.get("/apis/scheduling.k8s.io/v1/priorityclasses/tensor-fusion-critical")["value"] == 100000
    code, _ = run.stop()
    assert code == 0, run.output()


def test_role_all_without_fallback_has_no_gpus(role_all: RoleAll) -> None:
    """--sim-devices-fallback=off on a machine without a driver: the node registers without GPU labels."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver")
    run = role_all
    run.args += ["--sim-devices-fallback=off"]
    run.start()
    node = run.wait_for("the Node", lambda: run.get(f"/api/v1/nodes/{NODE}"))
    assert "nvidia.com/gpu.present" not in node["metadata"]["labels"]
    run.wait_for("the startup summary", lambda: "tfusion is running" in run.output())
    assert "no GPUs" in run.output()
    unselected = httpx.get(f"{run.api}{TF}/gpunodes/{NODE}", timeout=5, **run._api_auth())
    assert unselected.status_code == 404  # no pool selects it
    code, _ = run.stop()
    assert code == 0
