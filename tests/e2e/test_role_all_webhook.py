"""`tfusion --role=all` registers its pod webhook with the embedded API server: `kubectl create -f`
of an annotated pod comes back mutated with its TensorFusionWorkload, and a bad annotation is
refused with the webhook's message in kubectl's error, as is a pod its workload could not be named
after; a caller without the API server's client certificate is refused in the TLS handshake."""

from __future__ import annotations

import base64
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def kubectl(run: RoleAll, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          timeout=30, check=False)


def manifest(tmp: Path, name: str, notes: dict[str, str]) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": notes},
        "spec": {"containers": [{"name": "app", "image": "python:3.11-slim", "command": ["sleep", "3600"]}]}}))
    return str(path)


def registered(run: RoleAll) -> Any:
    items = run.get(WEBHOOKS)["items"]
    return [w for c in items for w in c["webhooks"] if w["name"] == "pod.tensor-fusion.ai"
            and w["clientConfig"].get("caBundle")]


@needs_kubectl
def test_kubectl_create_of_an_annotated_pod_comes_back_mutated(role_all: RoleAll, tmp_path: Path) -> None:
    role_all.start()
    role_all.wait_for("the controller and hypervisor ready", role_all.ready, timeout=40)
    (webhook,) = role_all.wait_for("the pod webhook registered", lambda: registered(role_all))
    assert webhook["clientConfig"]["url"].startswith("https://127.0.0.1:")
    assert webhook["objectSelector"] == {"matchExpressions": [
        {"key": "tensor-fusion.ai/enabled", "operator": "In", "values": ["true"]}]}

    created = kubectl(role_all, "create", "-f", manifest(tmp_path, "bare", {
        "tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"}), "-o", "yaml")
    assert created.returncode == 0, created.stderr
    pod = yaml.safe_load(created.stdout)
    notes = pod["metadata"]["annotations"]
    assert notes["tensor-fusion.ai/gpupool"] == "tensor-fusion-shared"
    assert notes["tensor-fusion.ai/qos"] == "medium" and notes["tensor-fusion.ai/isolation"] == "soft"
    assert pod["metadata"]["labels"]["tensor-fusion.ai/workload"] == "bare"
    assert pod["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert pod["spec"]["initContainers"][0]["name"] == "init-soft-limiter"
    workload = kubectl(role_all, "get", "tensorfusionworkload", "bare", "-o", "yaml")
    assert workload.returncode == 0, workload.stderr
    assert yaml.safe_load(workload.stdout)["spec"]["poolName"] == "tensor-fusion-shared"

    refused = kubectl(role_all, "create", "-f", manifest(tmp_path, "bad", {
        "tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/gpu-count": "0"}))
    assert refused.returncode == 1
    assert ('admission webhook "pod.tensor-fusion.ai" denied the request: annotation tensor-fusion.ai/gpu-count: '
            '"0" is not allowed; expected an integer from 1 to 128') in refused.stderr, refused.stderr

    unnamable = kubectl(role_all, "create", "-f", manifest(tmp_path, "a.", {
        "tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"}))
    assert unnamable.returncode == 1 and 'metadata.name: Invalid value: "a."' in unnamable.stderr, unnamable.stderr

    config = webhook["clientConfig"]
    context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default", "object": yaml.safe_load(Path(manifest(tmp_path, "ghost", {
            "tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"})).read_text())}}
    with pytest.raises(httpx.TransportError):
        httpx.post(config["url"], json=review, verify=context, timeout=10)
    assert kubectl(role_all, "get", "tensorfusionworkload", "ghost").returncode == 1


@needs_kubectl
def test_a_pod_created_as_soon_as_the_kubeconfig_appears_is_mutated(role_all: RoleAll, tmp_path: Path) -> None:
    """The API server serves (and writes its kubeconfig) before the controller has registered its
    webhook; a pod created in that window waits for it instead of being stored unmutated."""
    role_all.start()
    role_all.wait_for("the kubeconfig", role_all.kubeconfig.exists, timeout=40)
    created = kubectl(role_all, "create", "-f", manifest(tmp_path, "early", {
        "tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/vram-request": "8Gi"}), "-o", "yaml")
    assert created.returncode == 0, created.stderr
    pod = yaml.safe_load(created.stdout)
    assert pod["metadata"]["labels"]["tensor-fusion.ai/component"] == "worker"
    assert pod["spec"]["schedulerName"] == "tensor-fusion-scheduler"
