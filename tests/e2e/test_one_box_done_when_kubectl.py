"""Issue 25's "done when", the kubectl half: what a new user types against `tfusion --role=all`
(`kubectl run`, the remote vGPU client pod and its `/api/connection` curl, a second `kubectl apply` of
a changed Role and ClusterRoleBinding, `kubectl apply -k` of our own install overlay, `kubectl logs`
and `exec`) works as the README says, and the official `kubernetes` Python client reads the same
state. One --role=all process serves the whole module; every check polls with a deadline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.official_client import official_client
from tests.helpers.role_all import NODE, RoleAll

REPO = Path(__file__).resolve().parents[2]
CURL = shutil.which("curl") or ""
pytestmark = needs_kubectl
NO_CONTAINERS = "tfusion's embedded API server has no kubelet to ask, and the node it simulates runs no containers"


@pytest.fixture(scope="module")
def box(role_all_ready: RoleAll) -> RoleAll:
    """The module's one --role=all process (tests/helpers/role_all.py)."""
    return role_all_ready


@pytest.fixture(scope="module")
def core(box: RoleAll) -> Any:
    """The official client's CoreV1Api on the kubeconfig --role=all wrote."""
    return kube_client.CoreV1Api(official_client(box.kubeconfig))


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with the box's kubeconfig; a timeout so a hanging command fails instead of stalling."""
    return subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                          input=stdin, timeout=60, check=False, env={**os.environ, "HOME": str(run.tmp)})


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{' '.join(result.args[3:])}: {result.stdout}\n{result.stderr}"
    return result.stdout


def jsonpath(run: RoleAll, kind: str, name: str, path: str, namespace: str = "default") -> str:
    return ok(kubectl(run, "get", kind, name, "-n", namespace, "-o", f"jsonpath={path}"))


def scheduled_running(run: RoleAll, name: str) -> str | None:
    """`Running <node> True` once the pod is Running, bound and PodScheduled=True."""
    seen = jsonpath(run, "pod", name, '{.status.phase} {.spec.nodeName} '
                                      '{.status.conditions[?(@.type=="PodScheduled")].status}')
    return seen if seen == f"Running {NODE} True" else None


def test_kubectl_run_gives_a_running_pod_on_the_simulated_node(box: RoleAll, core: Any) -> None:
    assert "pod/plain created" in ok(kubectl(box, "run", "plain", "--image=busybox", "--", "sleep", "3600"))
    box.wait_for("pod plain Running and scheduled", lambda: scheduled_running(box, "plain"))

    pod = core.read_namespaced_pod("plain", "default")
    assert (pod.status.phase, pod.spec.node_name, pod.spec.scheduler_name) == ("Running", NODE, "default-scheduler")
    assert pod.spec.containers[0].args == ["sleep", "3600"]
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Ready"] == "True"


def remote_client_manifest(name: str) -> str:
    """The README's quick-start pod (deploy/examples/my-pod.yaml) made a remote vGPU client as the
    README's "Remote vGPU" says: `tensor-fusion.ai/is-local-gpu: "false"`, nothing else changed (it
    keeps its `schedulerName: tensor-fusion-scheduler`)."""
    pod = yaml.safe_load((REPO / "deploy/examples/my-pod.yaml").read_text())
    pod["metadata"]["name"] = name
    pod["metadata"]["annotations"]["tensor-fusion.ai/is-local-gpu"] = "false"
    return yaml.safe_dump(pod)


def connection_url(box: RoleAll, connection: str, token: str) -> str | None:
    """The README's curl of `/api/connection` with the client pod's token: the URL on 200."""
    url = f"{box.controller}/api/connection?name={connection}&namespace=default"
    result = subprocess.run([CURL, "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}", url],
                            capture_output=True, text=True, timeout=30, check=True)
    body, _, code = result.stdout.rpartition("\n")
    return body if code == "200" else None


@pytest.mark.skipif(not CURL, reason="curl is not installed")
def test_the_readme_remote_vgpu_client_pod_runs_and_gets_its_worker_url(box: RoleAll, core: Any) -> None:
    ok(kubectl(box, "apply", "-f", "-", stdin=remote_client_manifest("remote-client")))
    box.wait_for("the client pod Running and scheduled", lambda: scheduled_running(box, "remote-client"))
    env = {e.name: e.value for e in core.read_namespaced_pod("remote-client", "default").spec.containers[0].env}
    connection = env["TENSOR_FUSION_CONNECTION_NAME"]

    def connection_running() -> str | None:
        phase, url = jsonpath(box, "tensorfusionconnection", connection,
                              "{.status.phase} {.status.connectionURL}").partition(" ")[::2]
        return url if phase == "Running" and url else None

    url = box.wait_for("the TensorFusionConnection Running", connection_running, timeout=30)
    token = ok(kubectl(box, "create", "token", "default", "--bound-object-kind=Pod",
                       "--bound-object-name=remote-client")).strip()
    served = box.wait_for("the worker's URL from /api/connection", lambda: connection_url(box, connection, token))
    assert served == url and served.startswith(f"native+127.0.0.1+8000+{connection}-")
    assert (core.read_namespaced_pod(connection, "default").metadata.labels["tensor-fusion.ai/component"]
            == "worker")


ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: default}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
"""
CONFIGMAP_RULE = """- {apiGroups: [""], resources: [configmaps], verbs: [get]}
"""
BINDING = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: viewers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects:
- {kind: ServiceAccount, name: default, namespace: default}
"""
ALICE = """- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
"""


def stored(box: RoleAll, kind: str, name: str, field: str, namespace: str = "default") -> Any:
    return json.loads(ok(kubectl(box, "get", kind, name, "-n", namespace, "-o", "json")))[field]


def test_a_second_kubectl_apply_of_a_changed_role_and_binding_is_stored(box: RoleAll) -> None:
    assert "role.rbac.authorization.k8s.io/pod-reader created" in ok(kubectl(box, "apply", "-f", "-", stdin=ROLE))
    changed = ok(kubectl(box, "apply", "-f", "-", stdin=ROLE + CONFIGMAP_RULE))
    assert "role.rbac.authorization.k8s.io/pod-reader configured" in changed
    assert stored(box, "role", "pod-reader", "rules") == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    assert "unchanged" in ok(kubectl(box, "apply", "-f", "-", stdin=ROLE + CONFIGMAP_RULE))

    ok(kubectl(box, "apply", "-f", "-", stdin=BINDING))
    assert "configured" in ok(kubectl(box, "apply", "-f", "-", stdin=BINDING + ALICE))
    assert stored(box, "clusterrolebinding", "viewers", "subjects") == [
        {"kind": "ServiceAccount", "name": "default", "namespace": "default"},
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]
    # a subject the manifest no longer lists goes, as kubectl's three-way merge asks
    assert "configured" in ok(kubectl(box, "apply", "-f", "-", stdin=BINDING))
    assert stored(box, "clusterrolebinding", "viewers", "subjects") == [
        {"kind": "ServiceAccount", "name": "default", "namespace": "default"}]


def hypervisor_pod(box: RoleAll) -> dict[str, Any] | None:
    pods = json.loads(ok(kubectl(box, "get", "pods", "-n", "tensor-fusion-sys", "-l",
                                 "tensor-fusion.ai/component=hypervisor", "-o", "json")))["items"]
    running = [p for p in pods if p["spec"].get("nodeName") == NODE and p["status"].get("phase") == "Running"]
    return running[0] if len(pods) == 1 and running else None


def test_kubectl_apply_k_of_the_builtin_scheduler_overlay_succeeds(box: RoleAll) -> None:
    overlay = str(REPO / "deploy/overlays/builtin-scheduler")
    tried = ok(kubectl(box, "apply", "-k", overlay, "--dry-run=server"))
    assert "daemonset.apps/tensor-fusion-hypervisor created (server dry run)" in tried, tried
    assert kubectl(box, "get", "daemonset", "tensor-fusion-hypervisor", "-n", "tensor-fusion-sys").returncode != 0
    applied = ok(kubectl(box, "apply", "-k", overlay))
    for line in ("daemonset.apps/tensor-fusion-hypervisor created",
                 "networkpolicy.networking.k8s.io/tensor-fusion-controller created",
                 "deployment.apps/tensor-fusion-controller created"):
        assert line in applied, applied
    pod = box.wait_for("the hypervisor DaemonSet's pod bound and Running", lambda: hypervisor_pod(box), timeout=30)
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    selector = stored(box, "networkpolicy", "tensor-fusion-controller", "spec", "tensor-fusion-sys")["podSelector"]
    assert selector == {"matchLabels": {"app.kubernetes.io/name": "tensor-fusion-controller"}}
    # a second client-side apply of the same tree (what GitOps does on every sync) changes nothing
    again = ok(kubectl(box, "apply", "-k", overlay))
    assert "created" not in again and "daemonset.apps/tensor-fusion-hypervisor unchanged" in again, again
    # tfusion's own pod webhook still mutates new GPU pods after the overlay's configuration was applied
    ok(kubectl(box, "apply", "-f", str(REPO / "deploy/examples/my-pod.yaml")))
    box.wait_for("my-pod Running", lambda: scheduled_running(box, "my-pod"))
    assert jsonpath(box, "pod", "my-pod", "{.metadata.annotations.tensor-fusion\\.ai/gpu-ids}")


NO_LOGS = 'Error from server (BadRequest): container "quiet" in pod "quiet" has no logs'


@pytest.mark.parametrize(("command", "said"), [
    (("logs", "quiet"), NO_LOGS),
    (("logs", "-f", "quiet", "--tail=1"), NO_LOGS),
    (("exec", "quiet", "--", "true"),
     'Error from server (BadRequest): container "quiet" in pod "quiet" cannot run a command'),
    (("attach", "quiet"), 'Error from server (BadRequest): container "quiet" in pod "quiet" cannot be attached to'),
    (("port-forward", "pod/quiet", ":80"), 'error: error upgrading connection: pod "quiet" cannot forward ports'),
])
def test_kubectl_logs_exec_attach_port_forward_give_the_documented_error(
        box: RoleAll, command: tuple[str, ...], said: str) -> None:
    """The README's answer, at once and with a non-zero exit (kubectl's own timeout would show a hang)."""
    if kubectl(box, "get", "pod", "quiet").returncode != 0:
        ok(kubectl(box, "run", "quiet", "--image=busybox", "--", "sleep", "3600"))
    box.wait_for("pod quiet Running", lambda: scheduled_running(box, "quiet"))
    result = kubectl(box, *command)
    assert result.returncode != 0
    assert f"{said}: {NO_CONTAINERS}" in re.sub(r"\s+", " ", result.stderr), result.stderr
    assert "ASGI" not in box.output()


def test_the_python_client_gets_the_same_error_for_logs(box: RoleAll, core: Any) -> None:
    ok(kubectl(box, "run", "chatty", "--image=busybox", "--", "echo", "hi"))
    box.wait_for("pod chatty Running", lambda: scheduled_running(box, "chatty"))
    with pytest.raises(ApiException) as refused:
        core.read_namespaced_pod_log("chatty", "default")
    status = json.loads(str(refused.value.body))
    assert (refused.value.status, status["reason"]) == (400, "BadRequest")
    assert status["message"] == f'container "chatty" in pod "chatty" has no logs: {NO_CONTAINERS}'
