"""The built-in scheduler in real processes: kill -9 of the controller during a burst of binds
leaves no double allocation and no leak once it is back; and in `--role=all`, `kubectl create` of
an annotated pod reaches Running with `tensor-fusion.ai/gpu-ids` and shows in /api/allocation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.apiserver_fixture import apply_crds_sync
from tests.helpers import wait_until
from tests.helpers.controller_process import ControllerProcess
from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import RoleAll
from tfusion.api import annotations as tfa

pytestmark = needs_kubectl
POOL = "pool-a"
GPUS_PER_NODE = 4
NODES = 10
SLOTS_PER_GPU = 4  # 100 TFLOPS / 25 per pod
PODS = 180  # 160 slots: 20 pods can never fit


def api(apiserver: Any, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    response = httpx.request(method, f"{apiserver.url}{path}", headers={**apiserver.headers,
                                                                        "Content-Type": content_type},
                             content=json.dumps(body).encode() if body is not None else None,
                             verify=apiserver.ssl_context, timeout=10)
    assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def make_cluster(apiserver: Any) -> None:
    api(apiserver, "POST", "/apis/tensor-fusion.ai/v1/gpupools", {
        "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": {"name": POOL},
        "spec": {"nodeManagerConfig": {}}})
    for n in range(NODES):
        node = f"node-{n}"
        api(apiserver, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        api(apiserver, "PATCH", f"/api/v1/nodes/{node}/status", {"status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}}, "application/merge-patch+json")
        for g in range(GPUS_PER_NODE):
            name = f"gpu-{n}-{g}"
            api(apiserver, "POST", "/apis/tensor-fusion.ai/v1/gpus", {
                "apiVersion": "tensor-fusion.ai/v1", "kind": "GPU",
                "metadata": {"name": name, "labels": {tfa.GPU_POOL: POOL, tfa.MANAGED_BY: node}}})
            api(apiserver, "PATCH", f"/apis/tensor-fusion.ai/v1/gpus/{name}/status", {"status": {
                "phase": "Running", "vendor": "NVIDIA", "gpuModel": "A100", "uuid": f"GPU-{name}", "index": g,
                "message": "ok", "usedBy": "tensor-fusion", "isolationMode": "soft",
                "nodeSelector": {"kubernetes.io/hostname": node},
                "capacity": {"tflops": "100", "vram": "40Gi"}, "available": {"tflops": "100", "vram": "40Gi"}}},
                "application/merge-patch+json")


def worker(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"w-{i:03d}", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                         "annotations": {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: "25", tfa.VRAM_REQUEST: "8Gi"}},
            "spec": {"schedulerName": "tensor-fusion-scheduler", "containers": [{"name": "c", "image": "x"}]}}


def pods(apiserver: Any) -> list[dict[str, Any]]:
    return list(api(apiserver, "GET", "/api/v1/namespaces/default/pods")["items"])


def bound(apiserver: Any) -> list[dict[str, Any]]:
    return [p for p in pods(apiserver) if p["spec"].get("nodeName")]


def test_kill_9_during_a_burst_of_binds_leaves_no_double_allocation_and_no_leak(
        apiserver: Any, tmp_path: Path) -> None:
    apply_crds_sync(apiserver)
    make_cluster(apiserver)
    first = ControllerProcess("ctl-a", str(apiserver.kubeconfig), tmp_path)
    second: ControllerProcess | None = None
    try:
        first.wait_listening(30)
        wait_until(first.is_leader, 30, "the controller leads")
        creator = threading.Thread(target=lambda: [api(apiserver, "POST", "/api/v1/namespaces/default/pods",
                                                       worker(i)) for i in range(PODS)])
        creator.start()  # the burst: pods keep coming while the leader binds them
        wait_until(lambda: len(bound(apiserver)) >= 10, 30, "the first binds")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(5)
        at_kill = len(bound(apiserver))
        creator.join(60)
        second = ControllerProcess("ctl-a", str(apiserver.kubeconfig), tmp_path)  # same identity: leads at once
        port = second.wait_listening(30)
        slots = NODES * GPUS_PER_NODE * SLOTS_PER_GPU
        wait_until(lambda: len(bound(apiserver)) == slots, 60, f"{slots} pods bound after the restart")
        time.sleep(1.0)  # a bind beyond capacity would show now
        placed = bound(apiserver)
        assert at_kill < slots and len(placed) == slots

        # no double allocation: every GPU holds at most 4 pods, each pod on its GPU's node
        per_gpu: dict[str, int] = {}
        for pod in placed:
            (gpu,) = pod["metadata"]["annotations"][tfa.GPU_IDS].split(",")
            per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
            assert gpu.startswith(f"gpu-{pod['spec']['nodeName'].split('-')[1]}-")
        assert max(per_gpu.values()) == SLOTS_PER_GPU and len(per_gpu) == NODES * GPUS_PER_NODE

        # no leak: the leader holds exactly the bound pods' allocations, and nothing is free
        view = httpx.get(f"http://127.0.0.1:{port}/api/allocation", timeout=10).json()
        assert set(view["allocation"]) == {p["metadata"]["uid"] for p in placed}
        pending = [p for p in pods(apiserver) if not p["spec"].get("nodeName")]
        assert len(pending) == PODS - slots
        why = httpx.get(f"http://127.0.0.1:{port}/api/why",
                        params={"name": pending[0]["metadata"]["name"]}, timeout=10).json()
        assert why["message"].startswith(f"0/{NODES} nodes are available")

        def statuses_written() -> bool:
            gpus = api(apiserver, "GET", "/apis/tensor-fusion.ai/v1/gpus")["items"]
            return all(g["status"]["available"]["tflops"] == "0" for g in gpus)

        wait_until(statuses_written, 30, "every GPU's status.available written as full")
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()


def test_role_all_kubectl_create_of_an_annotated_pod_runs_with_gpu_ids(role_all: RoleAll) -> None:
    run = role_all
    run.start()
    run.wait_for("controller and hypervisor /readyz", run.ready, timeout=60)
    run.wait_for("GPUs reported", lambda: len(run.node_gpus()) == 3 and all(
        (g.get("status") or {}).get("phase") == "Running" for g in run.node_gpus()), timeout=60)
    manifest = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "gpu-app", "namespace": "default",
                             "labels": {tfa.ENABLED: "true"},
                             "annotations": {tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "1Gi"}},
                # no schedulerName and no worker label: the pod webhook sets them
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    created = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), "create", "-f", "-"],
                             input=json.dumps(manifest), capture_output=True, text=True, timeout=30,
                             env={**os.environ, "HOME": str(run.tmp)})
    assert created.returncode == 0, created.stderr

    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = run.get("/api/v1/namespaces/default/pods/gpu-app")
        return pod if pod["status"].get("phase") == "Running" else None

    pod = run.wait_for("the GPU pod Running", running, timeout=60)
    ids = pod["metadata"]["annotations"][tfa.GPU_IDS]
    assert ids in {g["metadata"]["name"] for g in run.node_gpus()}
    view = httpx.get(f"{run.controller}/api/allocation", timeout=10).json()
    assert pod["metadata"]["uid"] in view["allocation"]
    assert view["allocation"][pod["metadata"]["uid"]]["GPUNames"] == [ids]

