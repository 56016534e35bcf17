"""deploy/overlays/kube-scheduler renders with `kubectl kustomize` into a stock kube-scheduler whose one profile
`tensor-fusion-scheduler` calls the controller's extender routes through the controller Service,
with its own Lease, the ConfigMap mounted under its generated name, and the RBAC a kube-scheduler
needs (the authentication reader binding in kube-system)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tfusion.controller.scheduling.scheduler import SCHEDULER_NAME

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "kube-scheduler"

pytestmark = needs_kubectl


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict[str, Any]]:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def one(rendered: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for (k, _), d in rendered.items() if k == kind]
    assert len(found) == 1, f"{kind}: {len(found)}"
    return found[0]


def test_the_profile_calls_the_controller_extender(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    config_map = one(rendered, "ConfigMap")
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    assert config["leaderElection"]["resourceName"] == SCHEDULER_NAME  # not kube-scheduler's Lease
    (extender,) = config["extenders"]
    service = rendered[("Service", "tensor-fusion-controller")]
    port = service["spec"]["ports"][0]["port"]
    assert extender["urlPrefix"] == \
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}/scheduler"
    # the verbs are the controller's routes /scheduler/<verb>
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"], extender["preemptVerb"]) == \
        ("filter", "prioritize", "bind", "preempt")
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False


def test_the_deployment_runs_a_stock_kube_scheduler_on_that_config(
        rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = rendered[("Deployment", "tensor-fusion-scheduler")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("registry.k8s.io/kube-scheduler:")
    assert "--config=/etc/tensor-fusion/scheduler-config.yaml" in container["command"]
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == one(rendered, "ConfigMap")["metadata"]["name"]  # the hashed name
    assert pod["serviceAccountName"] == "tensor-fusion-scheduler"
    assert deployment["metadata"]["namespace"] == "tensor-fusion-sys"


def test_rbac_binds_the_kube_scheduler_roles(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    roles = {d["roleRef"]["name"]: d for (kind, _), d in rendered.items()
             if kind in ("ClusterRoleBinding", "RoleBinding")
             and d["metadata"]["name"].startswith("tensor-fusion-scheduler")}
    assert {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader",
            "tensor-fusion-scheduler-lease"} <= set(roles)
    assert roles["extension-apiserver-authentication-reader"]["metadata"]["namespace"] == "kube-system"
    for binding in roles.values():
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tensor-fusion-scheduler",
                                        "namespace": "tensor-fusion-sys"}]
