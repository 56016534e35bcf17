"""The webhook part of deploy/ (base/controller) renders with `kubectl kustomize` and says what the controller
registers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import KUBECTL
from tfusion.controller.webhook.certs import SECRET_NAME
from tfusion.controller.webhook.registration import CONFIGURATION_NAME, client_config, desired_configuration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "builtin-scheduler"


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    if not shutil.which(KUBECTL):
        pytest.skip("kubectl is not installed")
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY)], capture_output=True, text=True, check=True, timeout=60)
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(out.stdout) if d}


def test_the_service_maps_443_to_the_webhook_port(rendered: dict[str, dict[str, Any]]) -> None:
    service = rendered["Service/tensor-fusion-webhook"]
    assert service["metadata"]["namespace"] == "tensor-fusion-sys"
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": 9443, "protocol": "TCP"}]


def test_the_configuration_is_what_the_controller_keeps_current(rendered: dict[str, dict[str, Any]]) -> None:
    config = rendered[f"MutatingWebhookConfiguration/{CONFIGURATION_NAME}"]
    assert "namespace" not in config["metadata"]
    (webhook,) = config["webhooks"]
    assert "caBundle" not in webhook["clientConfig"], "the controller fills it"
    wanted = desired_configuration(client_config(url=None, service=("tensor-fusion-sys", "tensor-fusion-webhook"),
                                                 ca_bundle=None), widened=False)["webhooks"][0]
    assert webhook == wanted


def test_the_secret_is_granted_by_name(rendered: dict[str, dict[str, Any]]) -> None:
    role = rendered["Role/tensor-fusion-operator"]
    assert role["metadata"]["namespace"] == "tensor-fusion-sys"
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET_NAME],
            "verbs": ["get", "update"]} in role["rules"]
    binding = rendered["RoleBinding/tensor-fusion-operator"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tensor-fusion-operator",
                                    "namespace": "tensor-fusion-sys"}]
    cluster = rendered["ClusterRole/tensor-fusion-operator"]
    assert any("tokenreviews" in rule["resources"] for rule in cluster["rules"])
    assert {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [CONFIGURATION_NAME], "verbs": ["get", "update"]} in cluster["rules"]
