"""`tfusion --role=all` holds its hypervisor to its own node as a cluster does: the shipped admission
policy is served (kubectl lists it), the hypervisor's token names its node, its GPUs are reported
through the policy, and with the hypervisor's own kubeconfig kubectl is refused another node's GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import NODE, RoleAll, reported_gpus

POLICY = "tensor-fusion-hypervisor-own-node"


def kubectl(run: RoleAll, kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=30, input=stdin, check=False)


@needs_kubectl
def test_the_hypervisor_of_role_all_may_write_only_its_own_node(role_all: RoleAll) -> None:
    role_all.start()
    gpus = role_all.wait_for("3 GPU objects, Running, with capacity", lambda: reported_gpus(role_all), timeout=40)
    admin = role_all.kubeconfig
    listed = kubectl(role_all, admin, "get", "validatingadmissionpolicies,validatingadmissionpolicybindings",
                     "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [f"validatingadmissionpolicy.admissionregistration.k8s.io/{POLICY}",
                                     f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{POLICY}"]
    hypervisor = admin.with_name(f"{admin.name}.hypervisor")
    who = kubectl(role_all, hypervisor, "auth", "whoami", "-o", "jsonpath={.status.userInfo.extra}")
    assert who.returncode == 0, who.stderr
    assert f'"authentication.kubernetes.io/node-name":["{NODE}"]' in who.stdout
    other = ("apiVersion: tensor-fusion.ai/v1\nkind: GPU\nmetadata:\n  name: gpu-elsewhere\n"
             "  labels: {tensor-fusion.ai/managed-by: another-node}\n")
    assert kubectl(role_all, admin, "create", "-f", "-", stdin=other).returncode == 0
    refused = kubectl(role_all, hypervisor, "annotate", "gpu", "gpu-elsewhere", "taken=yes")
    assert refused.returncode == 1
    assert (f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: the hypervisor of node "
            f"{NODE} may not write GPU gpu-elsewhere") in refused.stderr, refused.stderr
    own = gpus[0]["metadata"]["name"]
    allowed = kubectl(role_all, hypervisor, "annotate", "gpu", own, "checked=yes")
    assert allowed.returncode == 0, allowed.stderr
