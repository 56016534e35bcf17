"""Topology-aware GPU choice in `tfusion --role=all` with a simulated topology (two NVLink pairs on
one PCIe switch): a 2-GPU pod with `require-gpu-topology: "true"` lands on an NVLink pair; when no
pair is free (one GPU of each taken), a pod asking `gpu-topology-max-tier: "0"` is refused with the
tier in its PodScheduled message and in `tfusion why`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.role_all import RoleAll

SPEC = "sim:4xA100-SXM4-80GB;nvlink=0-1,2-3;pcie-switch=0-1-2-3"
P = "tensor-fusion.ai/"
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    process.args += ["--devices", SPEC]
    process.start()
    try:
        yield process
    finally:
        process.shut_down()


def create(run: RoleAll, name: str, notes: dict[str, str]) -> None:
    created = httpx.post(f"{run.api}{PODS}", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {P + "enabled": "true"},
                     "annotations": {P + "tflops-request": "10", **{P + k: v for k, v in notes.items()}}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text


def gpu_ids(run: RoleAll, name: str) -> set[str] | None:
    pod: dict[str, Any] = run.get(f"{PODS}/{name}")
    ids = pod["metadata"]["annotations"].get(P + "gpu-ids") if pod["spec"].get("nodeName") else None
    return set(ids.split(",")) if ids else None


def refusal(run: RoleAll, name: str) -> str | None:
    pod: dict[str, Any] = run.get(f"{PODS}/{name}")
    found = [c for c in (pod.get("status") or {}).get("conditions") or []
             if c["type"] == "PodScheduled" and c["status"] == "False"]
    return found[0]["message"] if found else None


def test_an_nvlink_pair_is_chosen_and_a_tier_0_pod_waits_when_none_is_free(run: RoleAll) -> None:
    run.wait_for("tfusion to be ready", run.ready, timeout=60)

    def topology_gpus() -> list[str] | None:
        gpus = run.node_gpus()
        done = len(gpus) == 4 and all((g.get("status") or {}).get("phase") == "Running"
                                      and g["status"].get("topology") for g in gpus)
        return [g["metadata"]["name"] for g in gpus] if done else None

    uuids = run.wait_for("4 GPUs with their topology", topology_gpus, timeout=30)
    pairs = ({uuids[0], uuids[1]}, {uuids[2], uuids[3]})

    create(run, "pair", {"gpu-count": "2", "vram-request": "10Gi", "require-gpu-topology": "true"})
    assert run.wait_for("the pair pod bound", lambda: gpu_ids(run, "pair"), timeout=30) in pairs
    gone = httpx.delete(f"{run.api}{PODS}/pair", timeout=10, **run._api_auth())
    assert gone.status_code == 200, gone.text

    def absent() -> bool:
        return httpx.get(f"{run.api}{PODS}/pair", timeout=5, **run._api_auth()).status_code == 404

    run.wait_for("the pair pod gone", absent, timeout=30)
    for index in (0, 2):  # one GPU of each NVLink pair nearly full
        name = f"one-{index}"
        create(run, name, {"gpu-indices": str(index), "vram-request": "75Gi"})
        assert run.wait_for(f"{name} bound", partial(gpu_ids, run, name), timeout=30) == {uuids[index]}

    create(run, "tier0", {"gpu-count": "2", "vram-request": "10Gi", "gpu-topology-max-tier": "0"})
    message = run.wait_for("the tier-0 pod refused", lambda: refusal(run, "tier0"), timeout=30)
    assert message == "0/1 nodes are available: 1 best GPU set at topology tier 1, at most 0 allowed."
    why = subprocess.run([sys.executable, "-m", "tfusion", "why", "--kube", str(run.kubeconfig),
                          "--controller", run.controller, "-n", "default", "tier0"],
                         capture_output=True, text=True, timeout=60)
    assert why.returncode == 0, why.stderr
    assert "best 2 GPUs on node" in why.stdout and "joined at tier 1 (PCIe switch or host bridge); at most " \
        "tier 0 allowed" in why.stdout, why.stdout
