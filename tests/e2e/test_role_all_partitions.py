"""Issue 27's "done when" for partitions, against `tfusion --role=all` on a simulated A100-80GB whose
hypervisor stamps `isolationMode: partitioned` (a MIG node under the static policy), with the
shipped NVIDIA ProviderConfig applied as a user would (kubectl apply): three pods asking
`partition-id: 1g.10gb` run on the one GPU with three distinct slots in status.allocatedPartitions;
a 3g.40gb goes where four free slots are, a second one is explained; deleting one 1g pod frees its
slot for the next."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import TF, RoleAll

pytestmark = needs_kubectl

PROVIDER = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "defaults" / "providerconfig.yaml"


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RoleAll]:
    process = RoleAll(tmp_path)
    process.args += ["--devices", "sim:1xA100-SXM4-80GB", "--isolation-mode", "partitioned"]
    process.start()
    try:
        yield process
    finally:
        process.shut_down()


def create(run: RoleAll, name: str, template: str = "1g.10gb") -> None:
    created = httpx.post(f"{run.api}/api/v1/namespaces/default/pods", timeout=10, **run._api_auth(), json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"tensor-fusion.ai/enabled": "true"},
                     "annotations": {"tensor-fusion.ai/isolation": "partitioned",
                                     "tensor-fusion.ai/partition-id": template}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    assert created.status_code == 201, created.text


def one_running_gpu(run: RoleAll) -> list[dict[str, Any]] | None:
    gpus = run.node_gpus()
    return gpus if len(gpus) == 1 and (gpus[0].get("status") or {}).get("phase") == "Running" else None


def slots(run: RoleAll, gpu: str) -> dict[str, tuple[int, int]]:
    parts = (run.get(f"{TF}/gpus/{gpu}").get("status") or {}).get("allocatedPartitions") or {}
    return {entry["podName"]: (entry["allocatedSlotStart"], entry["allocatedSlotEnd"]) for entry in parts.values()}


def waiting(run: RoleAll, name: str) -> str | None:
    """The PodScheduled=False message of a pending pod, once it has one."""
    conditions = (run.get(f"/api/v1/namespaces/default/pods/{name}").get("status") or {}).get("conditions") or []
    found = [c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"]
    return str(found[0].get("message") or "") or None if found else None


def running(run: RoleAll, names: list[str]) -> list[dict[str, Any]] | None:
    pods = [run.get(f"/api/v1/namespaces/default/pods/{n}") for n in names]
    return pods if all((p.get("status") or {}).get("phase") == "Running" for p in pods) else None


def test_three_1g_pods_share_one_a100_on_distinct_slots_and_a_freed_slot_is_reused(run: RoleAll) -> None:
    run.wait_for("tfusion to be ready", run.ready, timeout=60)
    (gpu,) = run.wait_for("the GPU to be reported", lambda: one_running_gpu(run), timeout=60)
    applied = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), "apply", "-f", str(PROVIDER)],
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    names = ["mig-1", "mig-2", "mig-3"]
    for name in names:
        create(run, name)
    pods = run.wait_for("three partitioned pods Running", lambda: running(run, names), timeout=60)
    gpu_name = gpu["metadata"]["name"]
    assert {p["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"] for p in pods} == {gpu_name}
    assert {p["metadata"]["annotations"]["tensor-fusion.ai/partition-id"] for p in pods} == {"nv-80g-1g-10gb"}
    taken = run.wait_for("three partitions in the GPU status",
                         lambda: found if len(found := slots(run, gpu_name)) == 3 else None, timeout=30)
    assert len(set(taken.values())) == 3  # distinct slots

    # a larger slice goes where a slot range of its size is free; a second one is explained
    create(run, "big-1", "3g.40gb")
    run.wait_for("big-1 Running", lambda: running(run, ["big-1"]), timeout=60)
    start, end = run.wait_for("big-1's partition", lambda: slots(run, gpu_name).get("big-1"), timeout=30)
    assert end - start == 4 and all(e <= start or s >= end for s, e in taken.values())
    create(run, "big-2", "3g.40gb")
    message = run.wait_for("big-2 explained", lambda: waiting(run, "big-2"), timeout=60)
    assert "no free partition slot" in message, message
    why = httpx.get(f"{run.controller}/api/why", params={"namespace": "default", "name": "big-2"}, timeout=10)
    assert why.status_code == 200 and "no free slot for 3g.40gb" in why.text, why.text

    freed = taken["mig-2"]
    deleted = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), "delete", "pod", "mig-2",
                              "--wait=true"], capture_output=True, text=True, timeout=60)
    assert deleted.returncode == 0, deleted.stderr
    create(run, "mig-4")
    run.wait_for("mig-4 Running", lambda: running(run, ["mig-4"]), timeout=60)
    after = run.wait_for("mig-4's partition in the GPU status",
                         lambda: found if "mig-4" in (found := slots(run, gpu_name)) and "mig-2" not in found
                         else None, timeout=30)
    assert after["mig-4"] == freed
