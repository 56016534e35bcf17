"""The README's install command, `kubectl apply --server-side -k deploy/overlays/builtin-scheduler`,
against a running `tfusion --role=all`: it succeeds, the objects it applied belong to kubectl's
Apply entry, and a second run (what a GitOps sync does) succeeds again without conflicts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy/overlays/builtin-scheduler"
CONTROLLER = "/apis/apps/v1/namespaces/tensor-fusion-sys/deployments/tensor-fusion-controller"


def apply_server_side(run: RoleAll) -> str:
    result = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), "--cache-dir", str(run.tmp / "cache"),
                             "apply", "--server-side", "-k", str(OVERLAY)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stdout


@needs_kubectl
def test_the_readme_install_command_applies_server_side_twice(role_all: RoleAll) -> None:
    role_all.start()
    role_all.wait_for("the controller and hypervisor to be ready", role_all.ready, timeout=60)
    first = apply_server_side(role_all)
    assert "daemonset.apps/tensor-fusion-hypervisor serverside-applied" in first, first
    assert "deployment.apps/tensor-fusion-controller serverside-applied" in first, first
    controller = role_all.get(CONTROLLER)
    appliers = {e["manager"] for e in controller["metadata"]["managedFields"] if e["operation"] == "Apply"}
    assert appliers == {"kubectl"}
    spec_before = controller["spec"]
    second = apply_server_side(role_all)
    assert second.count("serverside-applied") == first.count("serverside-applied"), second
    assert role_all.get(CONTROLLER)["spec"] == spec_before
