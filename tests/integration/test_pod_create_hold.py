"""The embedded API server's hold on pod creates (`--role=all` starts with one until the controller
in the same process has registered its pod webhook): a held create is a 503 with Retry-After and
the reason, nothing else is held, and kubectl, which retries such an answer by itself, gets its pod
created once the hold is released."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.apiserver.webhooks import PodCreateHold

REASON = "starting: pods wait for the pod webhook"
PODS = "/api/v1/namespaces/default/pods"


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]}}


@pytest.fixture
def held(tmp_path: Path) -> Any:
    hold = PodCreateHold(REASON)
    handle = ApiServerHandle(tmp_path / "state.db", tmp_path / "kubeconfig", pod_create_hold=hold).start()
    yield handle, hold
    handle.stop()


def test_a_held_pod_create_is_503_with_retry_after_until_released(held: Any) -> None:
    handle, hold = held
    with handle.sync_http() as http:
        refused = http.post(PODS, json=pod("early"))
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["reason"] == "ServiceUnavailable" and refused.json()["message"] == REASON
        assert http.get(f"{PODS}/early").status_code == 404, "a held pod must not be stored"
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-held"}}
        assert http.post("/api/v1/namespaces/default/configmaps", json=config_map).status_code == 201

        hold.release()
        created = http.post(PODS, json=pod("early"))
        assert created.status_code == 201, created.text


@needs_kubectl
def test_kubectl_retries_a_held_create_until_the_hold_is_released(held: Any, tmp_path: Path) -> None:
    handle, hold = held
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod("patient")))  # JSON is YAML
    release = threading.Timer(2.0, hold.release)
    release.start()
    try:
        result = subprocess.run([KUBECTL, "--kubeconfig", handle.kubeconfig, "create", "-f", str(manifest)],
                                capture_output=True, text=True, timeout=60, check=False)
    finally:
        release.cancel()
    assert result.returncode == 0, result.stderr
    assert "pod/patient created" in result.stdout
    assert hold.reason is None, "kubectl finished before the hold was released"
