"""Issue 30's done-when in `--role=all` with the simulated provider, with kubectl and HTTP only:

1. a `Provisioned` pool with `minResources` gets GPUNodeClaims, and Nodes with GPUs join, until the
   minimum is met (`provisioningPhase: Completed`);
2. with the expander on, a pod too big for every node gets a node of a type that fits and runs on
   it; `/api/node-scaler` and the pod's condition show the node in flight meanwhile;
3. after the pod is deleted, compaction keeps the empty node while it carries `do-not-disrupt` and
   while the pool would fall below `warmResources`, and otherwise removes it once it is older than
   the minimum age: its claim is deleted and the simulated instance terminated (the Node goes).

The periods are seconds instead of minutes (`--compaction-min-node-age 8s`, a 2 s compaction
period, a 4 s boot); nothing waits on wall-clock speed beyond polling with deadlines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.helpers.kubectl import Kubectl, needs_kubectl
from tests.helpers.role_all import TF, RoleAll
from tfusion.api import annotations as tfa
from tfusion.api.timestamps import parse_rfc3339

pytestmark = [needs_kubectl, pytest.mark.timeout(300)]
MIN_AGE_S = 8

POOL = """
apiVersion: tensor-fusion.ai/v1
kind: GPUPool
metadata:
  name: burst
spec:
  capacityConfig:
    minResources: {tflops: "300", vram: 60Gi}
  nodeManagerConfig:
    provisioningMode: Provisioned
    nodeCompaction: {period: 2s}
"""

BIG_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: big
  labels: {tensor-fusion.ai/enabled: "true"}
  annotations:
    tensor-fusion.ai/gpupool: burst
    tensor-fusion.ai/tflops-request: "900"
    tensor-fusion.ai/tflops-limit: "900"
    tensor-fusion.ai/vram-request: 40Gi
    tensor-fusion.ai/vram-limit: 40Gi
spec:
  schedulerName: tensor-fusion-scheduler
  containers: [{name: c, image: app}]
"""


def claims(run: RoleAll) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = run.get(f"{TF}/gpunodeclaims?labelSelector={tfa.MANAGED_BY}%3Dburst")["items"]
    return items


def pool_status(run: RoleAll) -> dict[str, Any]:
    status: dict[str, Any] = run.get(f"{TF}/gpupools/burst").get("status") or {}
    return status


def node_names(run: RoleAll) -> set[str]:
    return {n["metadata"]["name"] for n in run.get("/api/v1/nodes")["items"]}


def instances(run: RoleAll) -> set[str]:
    items = run.get("/api/v1/namespaces/tensor-fusion-sys/configmaps?labelSelector="
                    "tensor-fusion.ai%2Fsimulated-instance%3Dtrue")["items"]
    return {c["metadata"]["name"] for c in items}


def minimum_met(run: RoleAll) -> list[dict[str, Any]] | None:
    status, made = pool_status(run), claims(run)
    done = status.get("provisioningPhase") == "Completed" and made and all(
        (c.get("status") or {}).get("phase") == "Bound" for c in made)
    return made if done else None


def scheduled_condition(run: RoleAll) -> str:
    pod = run.get("/api/v1/namespaces/default/pods/big")
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled":
            return str(condition.get("message") or "")
    return ""


def in_flight(run: RoleAll) -> dict[str, Any] | None:
    data: dict[str, Any] = httpx.get(f"{run.controller}/api/node-scaler", timeout=5).json()["data"]
    node = data["preSchedulePods"].get("default/big")
    # the promise is made when the claim is created; the claim shows once the controller's cache has it
    return data if node and node in data["inFlightNodeClaims"] else None


def test_a_provisioned_pool_grows_for_its_minimum_and_a_big_pod_then_gives_the_node_back(
        role_all: RoleAll, tmp_path: Any) -> None:
    role_all.args += ["--enable-auto-expander", "--simulated-boot-delay", "4s",
                      "--compaction-min-node-age", f"{MIN_AGE_S}s"]
    role_all.start()
    role_all.wait_for("the controller and hypervisor to be ready", role_all.ready, timeout=60)
    kubectl = Kubectl(role_all.kubeconfig, tmp_path / "kubectl-cache")

    # 1. the minimum: the cheapest claims that reach 300 TFLOPS / 60Gi are three 1-GPU L4 instances
    kubectl("apply", "-f", "-", input=POOL)
    made = role_all.wait_for("the pool's claims Bound and provisioningPhase Completed",
                             lambda: minimum_met(role_all), timeout=90)
    assert sorted(c["spec"]["instanceType"] for c in made) == ["g6.xlarge"] * 3
    status = pool_status(role_all)
    assert (status["totalNodes"], status["readyNodes"], status["totalGPUs"]) == (3, 3, 3)
    assert status["totalTFlops"] == "363" and status["phase"] == "Running"
    for claim in made:
        gpunode = role_all.get(f"{TF}/gpunodes/{claim['metadata']['name']}")
        assert gpunode["spec"] == {"manageMode": "Provisioned", "costPerHour": "$0.805"}
    assert json.loads(kubectl.out("get", "gpupool", "burst", "-o", "json"))["status"]["provisioningPhase"] == \
        "Completed"

    # 2. the expander: 900 TFLOPS fit only on an H100; the pod waits for a node made for it
    kubectl("apply", "-f", "-", input=BIG_POD)
    scaler = role_all.wait_for("the node in flight in /api/node-scaler", lambda: in_flight(role_all))
    node = scaler["preSchedulePods"]["default/big"]
    assert scaler["inFlightNodes"][node]["instanceType"] == "a3-highgpu-1g"
    assert scaler["inFlightNodeClaims"][node]["expansionSource"] == "catalog"
    role_all.wait_for("the pod's condition naming the node being provisioned",
                      lambda: f"a node is being provisioned for this pod (claim {node}, type a3-highgpu-1g"
                              in scheduled_condition(role_all))
    pod = role_all.wait_for("the big pod Running on its new node", lambda: _running_on(role_all, node), timeout=60)
    assert pod["spec"]["nodeName"] == node
    assert role_all.get(f"{TF}/gpunodeclaims/{node}")["metadata"]["labels"][tfa.EXPANSION_SOURCE] == "catalog"
    why = subprocess.run([sys.executable, "-m", "tfusion", "why", "--kube", str(role_all.kubeconfig), "--controller",
                          role_all.controller, "big"], capture_output=True, text=True, timeout=60)
    assert f"The node was provisioned for GPUPool burst by GPUNodeClaim {node} (a3-highgpu-1g, $11.06/h): the " \
           "node expander made it" in why.stdout, why.stdout + why.stderr

    # 3. compaction: the emptied H100 node stays while do-not-disrupt or warmResources keep it
    kubectl("label", "node", node, f"{tfa.DO_NOT_DISRUPT}=true")
    kubectl("delete", "pod", "big", "--wait=true")
    _passes_after_the_minimum_age(role_all, node)
    assert node in node_names(role_all), "do-not-disrupt keeps the node"
    kubectl("patch", "gpupool", "burst", "--type=merge", "-p",
            json.dumps({"spec": {"capacityConfig": {"warmResources": {"tflops": "1300"}}}}))
    kubectl("label", "node", node, f"{tfa.DO_NOT_DISRUPT}-")
    _passes_after_the_minimum_age(role_all, node)
    # 1352 TFLOPS idle, 1300 wanted: without the H100 363 would be left, without an L4 1231
    assert node in node_names(role_all), "warmResources keep the H100 node"
    assert len(claims(role_all)) == 4, "warmResources keep the L4 nodes too"

    kubectl("patch", "gpupool", "burst", "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/spec/capacityConfig/warmResources"}]))
    role_all.wait_for("the empty node's claim deleted and its instance terminated",
                      lambda: node not in {c["metadata"]["name"] for c in claims(role_all)}
                      and node not in node_names(role_all) and len(instances(role_all)) == 3, timeout=60)
    assert sorted(c["spec"]["instanceType"] for c in claims(role_all)) == ["g6.xlarge"] * 3
    events = kubectl.out("get", "events", "--field-selector", "involvedObject.name=burst", "-o",
                         "jsonpath={range .items[*]}{.reason}{'\\n'}{end}").split()
    assert {"ProvisioningNodes", "NodeExpansion", "Compaction"} <= set(events), events


def _running_on(run: RoleAll, node: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = run.get("/api/v1/namespaces/default/pods/big")
    return pod if pod["spec"].get("nodeName") == node and (pod.get("status") or {}).get("phase") == "Running" \
        else None


def _passes_after_the_minimum_age(run: RoleAll, node: str) -> None:
    """Wait until compaction has run twice after the node became old enough to be removed."""
    created = run.get(f"/api/v1/nodes/{node}")["metadata"]["creationTimestamp"]
    old_enough = parse_rfc3339(created).timestamp() + MIN_AGE_S

    def passes() -> bool:
        last = pool_status(run).get("lastCompactionTime")
        return bool(last) and parse_rfc3339(str(last)).timestamp() > old_enough + 4

    run.wait_for("two compaction passes after the node is old enough", passes, timeout=60)
