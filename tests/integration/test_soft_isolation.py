"""Soft isolation with the hypervisor running (Kubernetes backend, embedded API server, simulated
GPUs): a soft worker pod gets its shared-memory file with the right limits and a live heartbeat; a C
program reading the file agrees with `/api/v1/pod`, takes tokens and the PID-set lock while the
hypervisor writes; `POST /api/v1/process` registers a real process's PID, exited PIDs leave the set;
deleting the pod removes the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests import c as creader
from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.soft_isolation import NODE, SPEC, hypervisor, setup_node
from tfusion.api import annotations as tfa
from tfusion.hypervisor import role
from tfusion.hypervisor.shm.store import ShmStore
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import GPUNODES, GPUPOOLS, PODS, SCHEDULINGCONFIGTEMPLATES
from tfusion.settings import Settings

#: what a check raises while the hypervisor has not caught up yet
NOT_YET = (AssertionError, NotFound, KeyError, FileNotFoundError, RuntimeError)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if creader.gcc() is None:
        pytest.skip("no C compiler")
    return creader.build(tmp_path_factory.mktemp("shm-reader"))


def sleeper(pod: str) -> subprocess.Popen[bytes]:
    """A process that looks like the pod's container `main` in /proc (environ), as the limiter would."""
    env = {**os.environ, "POD_NAME": pod, "POD_NAMESPACE": "default", "CONTAINER_NAME": "main"}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


async def test_soft_worker_shared_memory_end_to_end(apiserver: ApiServerHandle, tmp_path: Path,
                                                    reader: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    children: list[subprocess.Popen[bytes]] = []
    try:
        await setup_node(kube)
        stray = tmp_path / "shm" / "gone" / "old-pod" / "shm"  # left by a pod deleted while we were down
        stray.parent.mkdir(parents=True)
        stray.write_bytes(b"\0" * 35504)
        async with hypervisor(apiserver, tmp_path) as http:
            async def swept() -> bool:
                assert not stray.exists() and not (tmp_path / "shm" / "gone").exists()
                return True

            await eventually(swept, 15, retry_on=NOT_YET)
            h100 = (await http.get("/api/v1/devices")).json()["data"][2]["UUID"]
            pod = await kube.create(PODS, {
                "metadata": {"name": "soft-0", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: h100, tfa.GPU_POOL: "pool-soft",
                                             tfa.ISOLATION: "soft",
                                             tfa.TFLOPS_REQUEST: "100", tfa.VRAM_REQUEST: "8Gi",
                                             tfa.TFLOPS_LIMIT: "200", tfa.VRAM_LIMIT: "16Gi"}},
                "spec": {"nodeName": NODE, "serviceAccountName": "default",
                         "containers": [{"name": "main", "image": "busybox"}]}})
            uid = pod["metadata"]["uid"]
            shm = tmp_path / "shm" / "default" / "soft-0" / "shm"

            async def written() -> dict[str, Any]:
                seen = creader.run(reader, shm)
                assert seen["devices"], seen
                return dict(seen)

            seen = await eventually(written, 15, retry_on=NOT_YET)
            token = await kube.request_token("default", "default", bound_pod={"name": "soft-0", "uid": uid})
            auth = {"Authorization": f"Bearer {token}"}
            info = (await http.get("/api/v1/pod", params={"container_name": "main"}, headers=auth)).json()
            assert info["success"] is True, info
            device = seen["devices"][0]
            assert seen["discriminant"] == 1 and seen["device_count"] == 1 and device["slot"] == 2
            assert [device["uuid"]] == info["data"]["gpu_uuids"] == ["GPU-" + h100[4:]]
            assert device["mem_limit"] == info["data"]["vram_limit"] == 16 * 1024**3
            assert device["up_limit"] == 21  # ceil(200 / 989 TFLOPS * 100)
            assert device["total_cuda_cores"] == 132 * 128 and device["is_active"] == 1

            first = seen["last_heartbeat"]

            async def beating() -> bool:
                assert creader.run(reader, shm)["last_heartbeat"] > first
                return True

            await eventually(beating, 15, retry_on=NOT_YET)

            async def rate_controlled() -> bool:
                now = creader.run(reader, shm)["devices"][0]
                assert now["capacity"] >= 200.0 and now["refill_rate"] != 10.0  # the ERL wrote its numbers
                return True

            await eventually(rate_controlled, 15, retry_on=NOT_YET)
            took = creader.run(reader, shm, "take", 2, 1)
            assert took["taken"] is True and took["after"] == pytest.approx(took["before"] - 1, abs=60)

            child = sleeper("soft-0")
            children.append(child)
            answer = (await http.post("/api/v1/process", headers=auth,
                                      params={"container_name": "main", "container_pid": str(child.pid)})).json()
            assert answer["success"] is True, answer
            assert answer["data"]["host_pid"] == child.pid
            assert creader.run(reader, shm, "pids")["pids"] == [child.pid]  # under the C side's lock

            child.kill()
            child.wait()

            async def pruned() -> bool:
                assert creader.run(reader, shm)["pids"] == []
                return True

            await eventually(pruned, 15, retry_on=NOT_YET)
            ready = (await http.get("/readyz")).json()
            by_name = {c["name"]: c for c in ready["conditions"]}
            assert by_name["shm-sync"]["ready"] is True and "1 shared-memory file" in by_name["shm-sync"]["message"]
            assert by_name["rate-limiter"]["ready"] is True

            # a file someone deleted comes back when the pod asks for its limits
            shm.unlink()
            again = (await http.get("/api/v1/pod", params={"container_name": "main"}, headers=auth)).json()
            assert again["success"] is True and shm.is_file()

            # the pod's own file goes with the pod
            await kube.delete(PODS, "soft-0", namespace="default", grace_period_seconds=0)

            async def removed() -> bool:
                assert not shm.exists() and not shm.parent.exists()
                return True

            await eventually(removed, 15, retry_on=NOT_YET)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        await kube.close()


async def test_an_unusable_file_is_reported_not_replaced(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        await setup_node(kube)
        blocked = tmp_path / "shm" / "default" / "blocked-0" / "shm"
        blocked.mkdir(parents=True)  # a directory where the file should be: nobody may replace it
        (blocked / "keep").write_text("someone else's")
        async with hypervisor(apiserver, tmp_path) as http:
            a100 = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
            pod = await kube.create(PODS, {
                "metadata": {"name": "blocked-0", "namespace": "default",
                             "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: a100, tfa.GPU_POOL: "pool-soft",
                                             tfa.ISOLATION: "soft"}},
                "spec": {"nodeName": NODE, "serviceAccountName": "default",
                         "containers": [{"name": "main", "image": "busybox"}]}})
            token = await kube.request_token("default", "default",
                                             bound_pod={"name": "blocked-0", "uid": pod["metadata"]["uid"]})

            async def refused() -> dict[str, Any]:
                body = (await http.get("/api/v1/pod", params={"container_name": "main"},
                                       headers={"Authorization": f"Bearer {token}"})).json()
                assert body.get("success") is False, body
                return dict(body)

            body = await eventually(refused, 15, retry_on=NOT_YET)
            assert body["message"].startswith("Failed to prepare shared memory:") and body["data"] is None
            process = (await http.post("/api/v1/process", params={"container_name": "main", "container_pid": "1"},
                                       headers={"Authorization": f"Bearer {token}"})).json()
            assert process["success"] is False and process["message"].startswith("Failed to prepare shared memory:")

            async def not_ready() -> bool:
                sync = next(c for c in (await http.get("/readyz")).json()["conditions"] if c["name"] == "shm-sync")
                assert sync["ready"] is False and "default/blocked-0" in sync["message"]
                return True

            await eventually(not_ready, 15, retry_on=NOT_YET)
            assert (blocked / "keep").read_text() == "someone else's"
    finally:
        await kube.close()


async def test_local_backend_soft_worker_knows_its_file(tmp_path: Path, reader: Path) -> None:
    """--backend=local: the shm root is under the state directory and a soft worker's command is told
    where its file is (TF_SHM_PATH); the file survives a hypervisor restart without being truncated."""
    settings = Settings.load({"backend": "local", "devices": SPEC, "hypervisor_port": 0, "state_dir": str(tmp_path),
                              "metrics_output_path": str(tmp_path / "metrics.log"), "node_name": "box-1"},
                             env={}, roles=("hypervisor",))
    shm = tmp_path / "shm" / "default" / "local-0" / "shm"
    for run in range(2):
        async with anyio.create_task_group() as tg:
            port = await tg.start(role.run, settings)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                if run == 0:
                    created = await http.post("/api/v1/workers", json={
                        "name": "local-0", "isolation": "soft", "requests": {"computePercent": "25", "vram": "2Gi"},
                        "limits": {"computePercent": "25", "vram": "2Gi"}})
                    assert created.status_code == 201, created.text
                    assert created.json()["data"]["Envs"]["TF_SHM_PATH"] == str(shm)
                    seen = await eventually(lambda: _read_async(reader, shm), 15, retry_on=NOT_YET)
                    assert (seen["devices"][0]["up_limit"], seen["devices"][0]["mem_limit"]) == (25, 2 * 1024**3)
                    assert creader.run(reader, shm, "take", seen["devices"][0]["slot"], 30)["taken"] is True
                    outside = ShmStore(tmp_path / "shm").open("default", "local-0")
                    outside.add_pid(os.getpid())  # a live PID: it must still be there after the restart
                    outside.close()
                else:
                    again = await eventually(lambda: _read_async(reader, shm), 15, retry_on=NOT_YET)
                    assert again["devices"][0]["up_limit"] == 25
                    assert again["pids"] == [os.getpid()]  # opened, not truncated, after the restart
                    assert (await http.delete("/api/v1/workers/local-0")).status_code == 200

                    async def gone() -> bool:
                        assert not shm.parent.exists()
                        return True

                    await eventually(gone, 15, retry_on=NOT_YET)
            tg.cancel_scope.cancel()


async def _read_async(reader: Path, shm: Path) -> dict[str, Any]:
    seen: dict[str, Any] = creader.run(reader, shm)
    assert seen["devices"], seen
    return seen


async def test_rate_limit_parameters_come_from_the_pools_template(apiserver: ApiServerHandle, tmp_path: Path,
                                                                 reader: Path) -> None:
    """The pool's SchedulingConfigTemplate `spec.hypervisor.elasticRateLimitParameters` reaches the
    limiter: an idle worker's rate ramps up until its bucket sits at the template's `capacityMax` 600
    (the default cap is 200000)."""
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        await kube.create(SCHEDULINGCONFIGTEMPLATES, {"metadata": {"name": "tpl-soft"}, "spec": {
            "placement": {"mode": "NodeCompactGPULowLoad"},
            "hypervisor": {"elasticRateLimitParameters": {"capacityMin": "500", "capacityMax": "600"}}}})
        pool = await kube.create(GPUPOOLS, {"metadata": {"name": "pool-tpl"},
                                            "spec": {"nodeManagerConfig": {}, "schedulingConfigTemplate": "tpl-soft"}})
        await kube.create(GPUNODES, {"metadata": {"name": NODE, "ownerReferences": [{
            "apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "name": "pool-tpl",
            "uid": pool["metadata"]["uid"], "controller": True}]}, "spec": {}})
        async with hypervisor(apiserver, tmp_path) as http:
            a100 = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
            await kube.create(PODS, {
                "metadata": {"name": "tpl-0", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: a100, tfa.GPU_POOL: "pool-tpl",
                                             tfa.ISOLATION: "soft"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
            shm = tmp_path / "shm" / "default" / "tpl-0" / "shm"

            async def capped() -> bool:
                device = creader.run(reader, shm)["devices"][0]
                assert device["capacity"] != 100.0  # the ERL has run (100 is the fresh file's value)
                assert device["capacity"] == 600.0, device  # capped by the template, not by 200000
                return True

            await eventually(capped, 15, retry_on=NOT_YET)
    finally:
        await kube.close()
