"""`tfusion doctor` against `tfusion --role=all`: clean on a healthy one; then, broken (the webhook's
caBundle replaced, a CRD deleted, a GPU node whose hypervisor does not run), each fault is named
with its fix and the exit code is 1. One test, so the breakage follows the clean run on the same
process whichever worker runs it.

The hypervisor of `--role=all` runs in the same process as the API server, so "hypervisor stopped"
is a second GPU node (a Node a pool selects, so the controller makes its GPUNode) at an address
where no hypervisor answers: what the doctor sees of a node whose hypervisor died.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.admission_helpers import CertificateAuthority
from tests.helpers.cli import run_main
from tests.helpers.role_all import POOL, TF, RoleAll, reported_gpus

CHECKS = {"crds", "webhook", "controller", "scheduler", "hypervisors", "device-plugins", "heartbeats", "rbac",
          "clock", "pools", "tensorfusion"}
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/tensor-fusion-pod-webhook"
MISSING_CRD = "workloadprofiles.tensor-fusion.ai"
DEAD_NODE = "gpu-node-b"


def doctor(run: RoleAll, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """`tfusion doctor -o json` in this process (the CRDs it compares with are generated once per process)."""
    port = str(urlsplit(run.hypervisor).port)
    code, out, err = run_main(["doctor", "--kube", str(run.kubeconfig), "--hypervisor-port", port, "-o", "json"],
                              capsys)
    assert err == "", err
    return code, json.loads(out)


def settled(run: RoleAll) -> bool:
    """The node reports its GPUs and the pool counts them: what a clean doctor run needs."""
    return bool(reported_gpus(run)) and run.get(f"{TF}/gpupools/{POOL}").get("status", {}).get("phase") == "Running"


def _break(run: RoleAll) -> None:
    auth = run._api_auth()
    with httpx.Client(base_url=run.api, timeout=10, **auth) as api:
        stranger = CertificateAuthority("stranger-ca").bundle
        answer = api.patch(WEBHOOKS, headers={**auth["headers"], "content-type": "application/json-patch+json"},
                           content=json.dumps([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle",
                                                "value": stranger}]))
        assert answer.status_code == 200, answer.text
        answer = api.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{MISSING_CRD}")
        assert answer.status_code == 200, answer.text
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": DEAD_NODE, "labels": {"nvidia.com/gpu.present": "true"}}}
        assert api.post("/api/v1/nodes", json=node).status_code == 201
        # 127.0.0.2 is loopback, where nothing listens on the hypervisor's port (it binds 127.0.0.1)
        answer = api.patch(f"/api/v1/nodes/{DEAD_NODE}/status",
                           headers={**auth["headers"], "content-type": "application/merge-patch+json"},
                           content=json.dumps({"status": {"addresses": [{"type": "InternalIP",
                                                                         "address": "127.0.0.2"}]}}))
        assert answer.status_code == 200, answer.text
    run.wait_for(f"the GPUNode of {DEAD_NODE}", lambda: run.get(f"{TF}/gpunodes/{DEAD_NODE}"), timeout=30)


def _errors(body: dict[str, Any], check: str) -> list[dict[str, str]]:
    return [f for f in body["findings"] if f["check"] == check and f["severity"] == "error"]


def test_doctor_is_clean_then_names_each_fault_with_its_fix(role_all_ready: RoleAll,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = role_all_ready
    run.wait_for("the node's GPUs and the pool Running", lambda: settled(run), timeout=30)
    code, body = doctor(run, capsys)
    assert code == 0, body
    assert body["summary"]["error"] == 0 and body["summary"]["warning"] == 0, body
    assert {f["check"] for f in body["findings"]} == CHECKS

    _break(run)
    code, body = doctor(run, capsys)
    assert code == 1, body

    [crds] = _errors(body, "crds")
    assert MISSING_CRD in crds["message"] and "tfusion crds | kubectl apply" in crds["fix"]

    certificate, call = _errors(body, "webhook")
    assert "caBundle of tensor-fusion-pod-webhook does not verify" in certificate["message"]
    assert "CN=stranger-ca" in certificate["message"] and "rollout restart" in certificate["fix"]
    assert 'failed calling webhook "pod.tensor-fusion.ai"' in call["message"] and "rollout restart" in call["fix"]

    [hypervisor] = _errors(body, "hypervisors")
    assert f"no hypervisor answers on GPU node {DEAD_NODE}" in hypervisor["message"]
    assert f"start the hypervisor on {DEAD_NODE}" in hypervisor["fix"]
    [plugins] = _errors(body, "device-plugins")
    assert f"node {DEAD_NODE} advertises 0 of the 16" in plugins["message"]

    # what is not broken says so
    assert {f["check"] for f in body["findings"] if f["severity"] == "ok"} >= {"controller", "scheduler", "rbac"}
