"""An external scaler in `tfusion --role=all`: the leader POSTs the workload's state to a real HTTP server
the test runs, with the API key from the Secret the workload names (readable once the namespace binds
the shipped `tensor-fusion-external-scaler-keys` ClusterRole); its answer becomes the recommendation and
the running worker's share; when the scaler fails, nothing changes and the condition says why; a bad
autoScalingConfig is refused in the condition, naming the field."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.autoscaler import (
    create_worker,
    patch_autoscaling,
    quantity,
    running,
    scaling_role_all,
    workload_of,
)
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll

POD = "steered"
KEY = "s3cret-key"


class Scaler(ThreadingHTTPServer):
    """Answers with `answer` (or status `fail`), remembering every request's body and Authorization."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer: dict[str, Any] = {}
        self.fail = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/recommend"


class _Handler(BaseHTTPRequestHandler):
    server: Scaler

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.server.calls.append((self.headers.get("authorization") or "", body))
        status, payload = (self.server.fail, {"error": "down"}) if self.server.fail else (200, self.server.answer)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def scaler() -> Iterator[Scaler]:
    server = Scaler()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    with running(scaling_role_all(tmp_path)) as process:
        yield process


def _kubectl(run: RoleAll, *args: str) -> None:
    done = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


def _condition(run: RoleAll, workload: str) -> dict[str, Any] | None:
    status = workload_of(run, workload).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "ResourcesRecommended"), None)


@needs_kubectl
def test_an_external_scaler_steers_the_share_and_its_failure_changes_nothing(run: RoleAll, scaler: Scaler) -> None:
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    _kubectl(run, "create", "secret", "generic", "scaler-key", "-n", "default", f"--from-literal=apiKey={KEY}")
    _kubectl(run, "create", "rolebinding", "external-scaler-keys", "-n", "default",
             "--clusterrole=tensor-fusion-external-scaler-keys",
             "--serviceaccount=tensor-fusion-sys:tensor-fusion-operator")
    pod = create_worker(run, POD)
    workload = pod["metadata"]["labels"]["tensor-fusion.ai/workload"]
    scaler.answer = {"needScaleUp": False, "needScaleDown": True, "reason": "quiet hours",
                     "recommendedResources": {"requests": {"tflops": "25", "vram": "4Gi"},
                                              "limits": {"tflops": "50", "vram": "8Gi"}}}
    patch_autoscaling(run, workload, {"autoSetResources": None, "externalScaler": {
        "enable": True, "url": scaler.url, "interval": "1s", "apiKeySecretRef": {"name": "scaler-key"}}})

    def steered() -> dict[str, Any] | None:
        notes = run.get(f"/api/v1/namespaces/default/pods/{POD}")["metadata"]["annotations"]
        return notes if quantity(notes["tensor-fusion.ai/tflops-request"]) == 25 else None

    notes = run.wait_for("the scaler's share on the running worker", steered, timeout=30)
    assert quantity(notes["tensor-fusion.ai/vram-limit"]) == 8 * 1024 ** 3
    auth, body = scaler.calls[0]
    assert auth == f"Bearer {KEY}"
    assert body["workloadName"] == workload and body["namespace"] == "default"
    assert quantity(body["currentResources"]["requests"]["tflops"]) == 40
    status = workload_of(run, workload)["status"]
    assert quantity(status["recommendation"]["requests"]["tflops"]) == 25
    assert (_condition(run, workload) or {}).get("reason") == "ExternalScaler"

    scaler.fail = 500
    failed = run.wait_for("the failure in the condition", lambda: (lambda c: c if c and c["status"] == "False"
                                                                    else None)(_condition(run, workload)))
    assert failed["reason"] == "ExternalScalerFailed" and "500" in failed["message"], failed
    assert quantity(workload_of(run, workload)["status"]["recommendation"]["requests"]["tflops"]) == 25

    patch_autoscaling(run, workload, {"autoSetResources": {"enable": True, "marginFraction": "lots"}})

    def refused() -> dict[str, Any] | None:
        found = _condition(run, workload)
        return found if found and found["reason"] == "InvalidConfig" else None

    bad = run.wait_for("the bad config in the condition", refused)
    assert "marginFraction" in bad["message"] and "lots" in bad["message"], bad
    answer = httpx.get(f"{run.controller}/api/recommendation", params={"name": workload}, timeout=5).json()
    assert not answer["enabled"] and "marginFraction" in answer["error"], answer
    missing = httpx.get(f"{run.controller}/api/recommendation", params={"name": "nobody"}, timeout=5)
    assert missing.status_code == 404 and missing.json() == {"error": "TensorFusionWorkload default/nobody not found"}
    unnamed = httpx.get(f"{run.controller}/api/recommendation", timeout=5)
    assert unnamed.status_code == 400 and "name" in unnamed.json()["error"], unnamed.text
