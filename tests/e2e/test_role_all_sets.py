"""`tfusion --role=all` runs a DaemonSet and a StatefulSet applied with kubectl: the DaemonSet's pod is
bound to the simulated node by its controller, the StatefulSet's pods (no nodeName) are placed by the
built-in scheduler, and `kubectl get` prints both kinds' columns."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import NODE, RoleAll

pytestmark = needs_kubectl
MANIFESTS = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: busybox}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: busybox}]}
"""
APPS = "/apis/apps/v1/namespaces/default"


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                            input=stdin, timeout=60, env={**os.environ, "HOME": str(run.tmp)})
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


def test_a_daemonset_and_a_statefulset_run_on_the_simulated_node(role_all: RoleAll) -> None:
    run = role_all
    run.start()
    run.wait_for("the controller and hypervisor to be ready", run.ready, timeout=60)
    applied = kubectl(run, "apply", "-f", "-", stdin=MANIFESTS)
    assert "daemonset.apps/agent created" in applied and "statefulset.apps/db created" in applied

    def status_of(path: str, key: str, wanted: int) -> dict[str, Any] | None:
        status = run.get(f"{APPS}/{path}").get("status") or {}
        return status if status.get(key) == wanted else None

    run.wait_for("the DaemonSet's ready pod", lambda: status_of("daemonsets/agent", "numberReady", 1), timeout=30)
    run.wait_for("the StatefulSet's 2 ready pods", lambda: status_of("statefulsets/db", "readyReplicas", 2),
                 timeout=30)
    pods = {p["metadata"]["name"]: p for p in run.get("/api/v1/namespaces/default/pods")["items"]}
    assert {"db-0", "db-1"} <= set(pods)
    for name in ("db-0", "db-1"):
        scheduled = next(c for c in pods[name]["status"]["conditions"] if c["type"] == "PodScheduled")
        assert pods[name]["spec"]["nodeName"] == NODE and scheduled["status"] == "True"
    table = kubectl(run, "get", "ds,sts")
    assert "NODE SELECTOR" in table and re.search(r"daemonset.apps/agent\s+1\s+1\s+1\s+1\s+1\s", table), table
    assert re.search(r"statefulset.apps/db\s+2/2\s", table), table
