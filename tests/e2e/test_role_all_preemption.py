"""Issue 26's "done when", the preemption part, against `tfusion --role=all` with kubectl: the
simulated node's GPUs are filled with `low` pods, half of them protected by
`tensor-fusion.ai/eviction-protection: 1h`; `critical` pods then arrive. Each preempts one
unprotected `low` pod (a `Preempted` event on the victim naming the preemptor, a `Preempting` event
on the preemptor) and runs on the node; the protected pods are never chosen, and the critical pod
that finds only protected pods left waits, saying so in its PodScheduled condition. The pods go
through the webhook (which names the PriorityClass), the embedded API server (which resolves it to
spec.priority and serves pods/eviction) and the simulated kubelet (which ends the evicted pods)."""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import NODE, RoleAll, reported_gpus
from tfusion.api.quantity import Quantity

pytestmark = needs_kubectl
GIB = 1 << 30


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                            input=stdin, timeout=60, check=False, env={**os.environ, "HOME": str(run.tmp)})
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


def gpu_pod(name: str, qos: str, vram_gib: int, *, protected: bool = False) -> dict[str, Any]:
    notes = {"tensor-fusion.ai/tflops-request": "1", "tensor-fusion.ai/vram-request": f"{vram_gib}Gi",
             "tensor-fusion.ai/qos": qos}
    if protected:
        notes["tensor-fusion.ai/eviction-protection"] = "1h"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"tensor-fusion.ai/enabled": "true"},
                         "annotations": notes},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": "python:3.11-slim", "command": ["sleep", "3600"]}]}}


def pods(run: RoleAll) -> dict[str, dict[str, Any]]:
    listed = json.loads(kubectl(run, "get", "pods", "-n", "default", "-o", "json"))["items"]
    return {p["metadata"]["name"]: p for p in listed}


def running(run: RoleAll, names: list[str]) -> bool:
    found = pods(run)
    return all(n in found and found[n]["status"].get("phase") == "Running"
               and found[n]["spec"].get("nodeName") == NODE for n in names)


def events(run: RoleAll, reason: str) -> list[dict[str, Any]]:
    listed = json.loads(kubectl(run, "get", "events", "-n", "default", "-o", "json"))["items"]
    return [e for e in listed if e.get("reason") == reason]


def condition(run: RoleAll, name: str) -> str:
    return kubectl(run, "get", "pod", name, "-o", 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')


@needs_kubectl
def test_critical_pods_preempt_unprotected_low_pods_and_never_protected_ones(role_all: RoleAll,
                                                                             tmp_path: Path) -> None:
    role_all.start()
    role_all.wait_for("the controller and hypervisor ready", role_all.ready, timeout=60)
    gpus = role_all.wait_for("the simulated GPUs reported", lambda: reported_gpus(role_all), timeout=60)
    half = min(Quantity.parse(g["status"]["capacity"]["vram"]).value() for g in gpus) // GIB // 2
    lows = [f"low-{i}" for i in range(2 * len(gpus))]  # two halves per GPU: every GPU full
    protected = {name for i, name in enumerate(lows) if i % 2 == 0}
    manifest = [gpu_pod(name, "low", half, protected=name in protected) for name in lows]
    kubectl(role_all, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifest))
    role_all.wait_for("the low pods running", lambda: running(role_all, lows), timeout=60)
    spec = pods(role_all)["low-0"]["spec"]
    assert (spec.get("priority"), spec.get("priorityClassName")) == (0, None)

    crits = [f"crit-{i}" for i in range(len(lows) - len(protected))]
    for name in crits:  # one at a time: each takes the place of one unprotected low pod
        kubectl(role_all, "apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod(name, "critical", half)))
        role_all.wait_for(f"{name} running", partial(running, role_all, [name]), timeout=60)
    spec = pods(role_all)["crit-0"]["spec"]
    assert (spec["priority"], spec["priorityClassName"]) == (100000, "tensor-fusion-critical")

    def victims_gone() -> set[str] | None:
        names = set(pods(role_all))
        return names if not (set(lows) - protected) & names else None

    left = role_all.wait_for("the victims gone", victims_gone, timeout=60)
    assert protected <= left
    preempted = events(role_all, "Preempted")
    victims = {e["involvedObject"]["name"] for e in preempted}
    assert victims == set(lows) - protected
    assert all(e["message"].startswith("Preempted by pod default/crit-") and f"on node {NODE}" in e["message"]
               for e in preempted)
    preempting = events(role_all, "Preempting")
    assert {e["involvedObject"]["name"] for e in preempting} == set(crits)
    assert all("(priority 0)" in e["message"] for e in preempting)

    kubectl(role_all, "apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod("crit-last", "critical", half)))
    def explained() -> str | None:
        text = condition(role_all, "crit-last")
        return text if "preemption:" in text else None

    message = role_all.wait_for("crit-last explains why it waits", explained, timeout=60)
    assert f"preemption: {len(protected)} pod(s) on {NODE} are protected until " in message
    assert protected <= set(pods(role_all))
    assert pods(role_all)["crit-last"]["spec"].get("nodeName") is None
