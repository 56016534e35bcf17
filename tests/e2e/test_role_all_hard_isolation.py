"""`tfusion --role=all`, hard isolation end to end (issue 27, item 5): pods asking `isolation: hard`
run with the worker container the original's images expect, carrying the hard limits. The node's
hypervisor runs `--isolation-mode hard`, so under the static policy its GPUs take hard pods.

- local with a sidecar worker: the pod comes back from kubectl with the `tensorfusion-worker`
  container holding `TF_CUDA_SM_PERCENT_LIMIT` (its compute-percent limit) and
  `TF_GPU_MEMORY_LIMIT`/`TF_CUDA_MEMORY_LIMIT` (its VRAM limit in MiB), the hypervisor's address
  and the shm mount; it is scheduled onto a simulated GPU and Running;
- remote vGPU: the client's dedicated worker pod, created by the controller, has the same
  container with the memory limit (a TFLOPS limit becomes a percent only on the GPU picked, so the
  scheduler's `effective-hard-sm-percent` carries it to the hypervisor), and is Running on a GPU.
"""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll

P = "tensor-fusion.ai/"


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          timeout=30, check=False, input=stdin)


def pod_manifest(name: str, notes: dict[str, str]) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "labels": {P + "enabled": "true"}, "annotations": notes},
        "spec": {"containers": [{"name": "app", "image": "python:3.11-slim", "command": ["sleep", "3600"]}]}})


def running(run: RoleAll, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{name}")
    bound = pod["spec"].get("nodeName") and pod["metadata"].get("annotations", {}).get(P + "gpu-ids")
    return pod if bound and (pod.get("status") or {}).get("phase") == "Running" else None


def worker_env(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "tensorfusion-worker"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def create(run: RoleAll, name: str, notes: dict[str, str]) -> dict[str, Any]:
    created = run.wait_for(f"pod {name} admitted", lambda: kubectl(
        run, "create", "-f", "-", "-o", "yaml", stdin=pod_manifest(name, notes)), timeout=20)
    assert created.returncode == 0, created.stderr
    pod: dict[str, Any] = yaml.safe_load(created.stdout)
    return pod


@needs_kubectl
def test_hard_isolation_sidecar_and_remote_workers_run_with_the_limits(role_all: RoleAll) -> None:
    role_all.args += ["--isolation-mode", "hard"]  # the node's GPUs take hard pods (static policy)
    role_all.start()
    role_all.wait_for("the controller and hypervisor ready", role_all.ready, timeout=40)

    pod = create(role_all, "hard-local", {
        P + "sidecar-worker": "true", P + "isolation": "hard", P + "compute-percent-request": "30",
        P + "compute-percent-limit": "30", P + "vram-request": "4Gi", P + "vram-limit": "4Gi"})
    env = worker_env(pod)
    assert (env["TF_CUDA_SM_PERCENT_LIMIT"], env["TF_GPU_MEMORY_LIMIT"], env["TF_CUDA_MEMORY_LIMIT"]) == \
        ("30", "4096", "4096")
    assert env["HYPERVISOR_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["CONTAINER_NAME"] == "tensorfusion-worker" and "LD_PRELOAD" not in env
    (sidecar,) = [c for c in pod["spec"]["containers"] if c["name"] == "tensorfusion-worker"]
    assert "/run/tensor-fusion/shm" in {m["mountPath"] for m in sidecar["volumeMounts"]}
    assert pod["spec"]["initContainers"][0]["resources"]["limits"] == {"cpu": "20m", "memory": "256Mi"}
    placed = role_all.wait_for("the sidecar pod scheduled and Running", lambda: running(role_all, "hard-local"),
                               timeout=30)
    assert placed["metadata"]["annotations"][P + "isolation"] == "hard"

    client = create(role_all, "hard-client", {
        P + "is-local-gpu": "false", P + "isolation": "hard", P + "tflops-limit": "20", P + "vram-limit": "8Gi"})
    name = {e["name"]: e.get("value") for e in client["spec"]["containers"][0]["env"]}["TENSOR_FUSION_CONNECTION_NAME"]
    (inject,) = client["spec"]["initContainers"]
    assert {m["mountPath"] for m in inject["volumeMounts"]} == {"/tensor-fusion", "/tensor-fusion-conf"}
    worker = role_all.wait_for("the remote worker scheduled and Running", lambda: running(role_all, name), timeout=30)
    env = worker_env(worker)
    assert env["TF_GPU_MEMORY_LIMIT"] == env["TF_CUDA_MEMORY_LIMIT"] == "8192"
    assert "TF_CUDA_SM_PERCENT_LIMIT" not in env, "a TFLOPS limit is a percent only of the GPU picked"
    notes = worker["metadata"]["annotations"]
    assert notes[P + "isolation"] == "hard" and 1 <= int(notes[P + "effective-hard-sm-percent"]) <= 100
    assert worker["spec"]["containers"][0]["command"] == ["./tensor-fusion-worker", "-p", "8000"]
