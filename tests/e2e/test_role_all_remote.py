"""`tfusion --role=all`, remote vGPU as issue 15 says it is done: a client pod created with kubectl gets
its TensorFusionConnection, whose worker is scheduled onto a simulated GPU and run by the simulated
kubelet; curl with that pod's token gets the URL, another pod's token 401, an unknown name 404;
deleting the worker gives a new worker and a new URL."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll

CURL = shutil.which("curl") or "curl"


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          timeout=30, check=False, input=stdin)


def curl(run: RoleAll, name: str, token: str) -> tuple[int, str]:
    result = subprocess.run([CURL, "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
                             f"{run.controller}/api/connection?name={name}&namespace=default"],
                            capture_output=True, text=True, timeout=30, check=True)
    body, _, code = result.stdout.rpartition("\n")
    return int(code), body


def pod_manifest(name: str, notes: dict[str, str] | None = None) -> str:
    labels = {"tensor-fusion.ai/enabled": "true"} if notes else {}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "labels": labels, "annotations": notes or {}},
        "spec": {"containers": [{"name": "app", "image": "python:3.11-slim", "command": ["sleep", "3600"]}]}})


def token_for(run: RoleAll, pod: str) -> str:
    result = kubectl(run, "create", "token", "default", "--bound-object-kind=Pod", f"--bound-object-name={pod}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def worker(run: RoleAll, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = run.get(f"/api/v1/namespaces/default/pods/{name}")
    return pod if (pod.get("status") or {}).get("phase") == "Running" and pod["status"].get("podIP") else None


def url_other_than(run: RoleAll, name: str, token: str, old: str = "") -> str | None:
    code, body = curl(run, name, token)
    return body if code == 200 and body != old else None


def worker_other_than(run: RoleAll, name: str, old_uid: str) -> dict[str, Any] | None:
    pod = worker(run, name)
    return pod if pod and pod["metadata"]["uid"] != old_uid else None


@needs_kubectl
@pytest.mark.skipif(not shutil.which(CURL), reason="curl is not installed")
def test_a_remote_client_gets_its_worker_url_with_its_own_token(role_all: RoleAll) -> None:
    role_all.start()
    role_all.wait_for("the controller and hypervisor ready", role_all.ready, timeout=40)
    notes = {"tensor-fusion.ai/is-local-gpu": "false", "tensor-fusion.ai/tflops-request": "20",
             "tensor-fusion.ai/vram-request": "8Gi"}
    created = role_all.wait_for("the client pod admitted", lambda: kubectl(
        role_all, "create", "-f", "-", "-o", "yaml", stdin=pod_manifest("client", notes)), timeout=20)
    assert created.returncode == 0, created.stderr
    pod = yaml.safe_load(created.stdout)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    name = env["TENSOR_FUSION_CONNECTION_NAME"]
    assert env["TENSOR_FUSION_OPERATOR_GET_CONNECTION_URL"].startswith(f"{role_all.controller}/api/connection?")

    conn = role_all.wait_for("the connection", lambda: kubectl(
        role_all, "get", "tensorfusionconnection", name, "-o", "yaml").returncode == 0)
    assert conn
    running = role_all.wait_for("the worker Running on a simulated GPU", lambda: worker(role_all, name), timeout=30)
    assert running["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"]
    token = token_for(role_all, "client")
    url = role_all.wait_for("the URL", lambda: url_other_than(role_all, name, token))
    assert url.startswith(f"native+127.0.0.1+8000+{name}-")

    assert kubectl(role_all, "create", "-f", "-", stdin=pod_manifest("other")).returncode == 0
    assert curl(role_all, name, token_for(role_all, "other"))[0] == 401
    assert curl(role_all, "no-such-connection", token)[0] == 404

    old_uid = running["metadata"]["uid"]
    assert kubectl(role_all, "delete", "pod", name, "--wait=false").returncode == 0
    role_all.wait_for("a new worker Running", lambda: worker_other_than(role_all, name, old_uid), timeout=30)
    new_url = role_all.wait_for("the new URL", lambda: url_other_than(role_all, name, token, url), timeout=20)
    assert new_url.startswith(f"native+127.0.0.1+8000+{name}-")

