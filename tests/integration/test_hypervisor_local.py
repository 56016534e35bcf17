"""The hypervisor's HTTP API over real HTTP with the local backend and simulated devices."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import eventually
from tests.helpers.local_hypervisor import hypervisor
from tfusion.hypervisor.workers.procfs import ProcFS

pytestmark = pytest.mark.anyio


async def test_probes_and_devices(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        conditions = {c["name"]: c for c in ready.json()["conditions"]}
        assert conditions["discovery"] == {"name": "discovery", "ready": True, "message": "3 device(s) from sim"}
        assert set(conditions) == {"discovery", "shm-sync", "rate-limiter"}  # soft isolation's loops
        devices = (await http.get("/api/v1/devices")).json()["data"]
        assert [{k: d[k] for k in ("Model", "Healthy", "Index")} for d in devices] == [
            {"Model": "NVIDIA A100-SXM4-80GB", "Healthy": True, "Index": 0},
            {"Model": "NVIDIA A100-SXM4-80GB", "Healthy": True, "Index": 1},
            {"Model": "NVIDIA H100 80GB HBM3", "Healthy": True, "Index": 2}]
        assert {"UUID", "Vendor", "NUMANode", "TotalMemoryBytes", "MaxTflops", "Properties"} <= set(devices[0])
        one = await http.get(f"/api/v1/devices/{devices[2]['UUID']}")
        assert one.json()["data"]["MaxTflops"] == 989
        missing = await http.get("/api/v1/devices/gpu-nope")
        assert (missing.status_code, missing.json()) == (404, {"error": "Device not found"})
        unknown_route = await http.get("/api/v1/nothing")
        assert unknown_route.status_code == 404 and "error" in unknown_route.json()
        # a device turns unhealthy (through the simulator's load file) and rediscovery reports it
        (tmp_path / "sim-load.json").write_text(json.dumps({"devices": {"1": {"healthy": False,
                                                                              "healthMessage": "XID 79"}}}))
        found = await http.post("/api/v1/devices/discover")
        assert found.status_code == 200 and found.json()["status"] == "Device discovery triggered"
        healthy = [d["Healthy"] for d in (await http.get("/api/v1/devices")).json()["data"]]
        assert healthy == [True, False, True]
        assert "unhealthy" in (await http.get("/readyz")).json()["conditions"][0]["message"]
        assert json.loads((tmp_path / "devices.json").read_text())[1]["Healthy"] is False


async def test_worker_lifecycle_with_a_supervised_process(tmp_path: Path) -> None:
    env_file = tmp_path / "env.txt"
    async with hypervisor(tmp_path) as http:
        h100 = (await http.get("/api/v1/devices")).json()["data"][2]["UUID"]
        created = await http.post("/api/v1/workers", json={
            "name": "trainer", "requests": {"tflops": "100", "vram": "8Gi"},
            "limits": {"tflops": "200", "vram": "16Gi"},
            "gpuIds": [h100], "isolation": "hard", "qos": "low", "env": {"EXTRA": "1"},
            "command": ["sh", "-c", f"env > {env_file}.tmp && mv {env_file}.tmp {env_file}; exec sleep 60"]})
        assert created.status_code == 201, created.text
        allocation = created.json()["data"]
        uid = allocation["WorkerInfo"]["WorkerUID"]
        assert allocation["WorkerInfo"]["AllocatedDevices"] == [h100]
        assert allocation["WorkerInfo"]["Requests"] == {"tflops": "100", "compute": "0", "vram": "8Gi"}
        assert allocation["WorkerInfo"]["WorkerRunningInfo"]["isRunning"] is True
        pid = allocation["WorkerInfo"]["WorkerRunningInfo"]["pid"]
        native = "GPU-" + h100[4:]
        assert allocation["Envs"]["NVIDIA_VISIBLE_DEVICES"] == native
        assert allocation["Envs"]["TF_CUDA_SM_PERCENT_LIMIT"] == "21"  # 200 of 989 TFLOPS, rounded up

        await eventually(lambda: anyio.to_thread.run_sync(env_file.exists))
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        assert env["NVIDIA_VISIBLE_DEVICES"] == native and env["CUDA_VISIBLE_DEVICES"] == native
        assert env["TF_CUDA_SM_PERCENT_LIMIT"] == "21" and env["TF_GPU_MEMORY_LIMIT"] == str(16 * 1024**3)
        assert env["POD_NAME"] == "trainer" and env["TF_WORKER_UID"] == uid and env["EXTRA"] == "1"

        # the simulated driver reports the worker's process on the H100: per-process usage
        (tmp_path / "sim-load.json").write_text(json.dumps({"processes": [
            {"pid": pid, "device": 2, "memoryBytes": 3 * 1024**3, "computePercent": 40}]}))

        async def usage_seen() -> bool:
            data = (await http.get(f"/api/v1/workers/{uid}")).json()["data"]
            return bool(data["metrics"][h100])

        await eventually(usage_seen)
        data = (await http.get(f"/api/v1/workers/{uid}")).json()["data"]
        assert data["worker_uid"] == uid
        usage = data["metrics"][h100][str(pid)]
        assert usage["MemoryBytes"] == 3 * 1024**3 and usage["ComputePercentage"] == 40
        assert usage["MemoryPercentage"] == pytest.approx(3 / 16 * 100)
        assert (await http.get("/api/v1/workers/trainer")).json()["data"]["worker_uid"] == uid  # by name too

        listed = (await http.get("/api/v1/workers")).json()["data"]
        assert [w["WorkerInfo"]["WorkerName"] for w in listed] == ["trainer"]
        limiter = (await http.get("/api/v1/limiter")).json()
        assert limiter == {"limiters": [{
            "worker_uid": uid, "requests": {"tflops": "100", "compute": "0", "vram": "8Gi"},
            "limits": {"tflops": "200", "compute": "0", "vram": "16Gi"}}]}
        assert (await http.post("/api/v1/trap")).json() == {"message": "trap initiated", "snapshot_count": 1}
        pods = (await http.get("/api/v1/pod")).json()
        assert pods == {"pods": [{"pod_name": "trainer", "namespace": "default", "gpu_uuids": [h100],
                                  "tflops_limit": 200.0, "vram_limit": 16 * 1024**3, "qos_level": "low"}]}
        snap = await http.post(f"/api/v1/workers/{uid}/snapshot")
        assert (snap.status_code, snap.json()) == (501, {"error": "worker snapshot is not implemented yet"})
        assert (await http.post(f"/api/v1/workers/{uid}/resume")).status_code == 501
        assert (await http.post("/api/v1/workers/nope/snapshot")).status_code == 404

        metrics = (await http.get("/metrics")).text
        labels = f'gpu="{h100}",model="NVIDIA H100 80GB HBM3",node="box-1",pool="local"'
        assert f"tfusion_gpu_device_tflops{{{labels}}} 989.0" in metrics
        assert "tfusion_worker_memory_used_bytes{" in metrics and 'pod="trainer"' in metrics

        deleted = await http.delete(f"/api/v1/workers/{uid}")
        assert deleted.status_code == 200 and deleted.json()["data"]["released"] == [h100]
        assert (await http.get(f"/api/v1/workers/{uid}")).status_code == 404
        assert (await http.delete(f"/api/v1/workers/{uid}")).status_code == 404
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(pid, 0)
        # the whole H100 is free again
        again = await http.post("/api/v1/workers", json={"name": "big", "requests": {"tflops": "989", "vram": "1Gi"},
                                                         "gpuIds": [h100]})
        assert again.status_code == 201, again.text
    lines = (tmp_path / "metrics.log").read_text().splitlines()
    assert any(line.startswith("tf_gpu_usage,node=box-1,pool=local,uuid=") for line in lines)
    assert any(line.startswith("tf_worker_usage,") and "pod_name=trainer" in line for line in lines)


async def test_the_metrics_file_in_otlp_json(tmp_path: Path) -> None:
    path = tmp_path / "metrics.log"
    async with hypervisor(tmp_path, metrics_format="otel") as http:
        devices = {d["UUID"] for d in (await http.get("/api/v1/devices")).json()["data"]}
        with anyio.fail_after(10):
            while not path.exists() or not path.read_text():
                await anyio.sleep(0.1)
    request = json.loads(path.read_text().splitlines()[0])  # one OTLP/JSON request a batch
    (scope,) = request["resourceMetrics"][0]["scopeMetrics"]
    memory = [m for m in scope["metrics"] if m["name"] == "tf_gpu_usage_memory_bytes"]
    attributes = [{a["key"]: a["value"]["stringValue"] for a in m["gauge"]["dataPoints"][0]["attributes"]}
                  for m in memory]
    assert {a["uuid"] for a in attributes} == devices
    assert all((a["node"], a["pool"]) == ("box-1", "local") for a in attributes)
    assert all(int(m["gauge"]["dataPoints"][0]["asInt"]) >= 0 for m in memory)


async def test_over_asking_and_bad_bodies(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        too_big = await http.post("/api/v1/workers", json={"name": "w", "requests": {"tflops": "2000", "vram": "1Gi"}})
        assert too_big.status_code == 409
        body = too_big.json()
        assert "does not fit" in body["error"]
        assert len(body["free"]) == 3 and {"uuid", "availableTflops", "availableVram"} <= set(body["free"][0])
        assert any("TFLOPS available" in reason for reason in body["reasons"])
        cases = [
            ({"requests": {"tflops": "1"}}, "name"),
            ({"name": "Bad_Name"}, "name"),
            ({"name": "w", "requests": {"tflops": "lots"}}, "requests.tflops"),
            ({"name": "w", "requests": {"gpus": 1}}, "requests.gpus"),
            ({"name": "w", "gpuCount": 9}, "gpuCount"),
            ({"name": "w", "gpuIds": ["gpu-nope"]}, "gpuIds"),
            ({"name": "w", "isolation": "magic"}, "isolation"),
            ({"name": "w", "qos": "urgent"}, "qos"),
            ({"name": "w", "command": 5}, "command"),
            ({"name": "w", "env": {"A": 1}}, "env"),
            ({"name": "w", "colour": "red"}, "colour"),
            ({"name": "w", "requests": {"tflops": "10", "computePercent": 10}}, "requests.computePercent"),
        ]
        for payload, field in cases:
            response = await http.post("/api/v1/workers", json=payload)
            assert response.status_code == 422, (payload, response.text)
            assert response.json()["field"] == field, (payload, response.json())
            assert field.split(".")[-1] in response.json()["error"] or field in response.json()["error"]
        assert (await http.post("/api/v1/workers", content=b"{nope")).status_code == 400
        assert (await http.post("/api/v1/workers", content=b"[1]")).json() == {
            "error": "request body must be a JSON object, got list"}
        ok = await http.post("/api/v1/workers", json={"name": "w", "requests": {"tflops": "10", "vram": "1Gi"}})
        assert ok.status_code == 201
        dup = await http.post("/api/v1/workers", json={"name": "w", "requests": {"tflops": "10", "vram": "1Gi"}})
        assert dup.status_code == 409 and "already exists" in dup.json()["error"]


async def test_token_routes_need_kubernetes_in_local_mode(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        for response in (await http.get("/api/v1/pod", params={"container_name": "main"}),
                         await http.get("/api/v1/pod", headers={"Authorization": "Bearer abc"}),
                         await http.post("/api/v1/process", params={"container_name": "c", "container_pid": "5"})):
            assert response.status_code == 401
            assert "needs the Kubernetes backend" in response.json()["error"]
        missing = await http.post("/api/v1/process", params={"container_name": "c"})
        assert missing.status_code == 400 and "container_pid" in missing.json()["error"]


async def test_state_survives_a_restart(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        first = (await http.post("/api/v1/workers", json={
            "name": "keeper", "requests": {"tflops": "300", "vram": "70Gi"}, "gpuCount": 1,
            "command": ["sleep", "60"]})).json()["data"]["WorkerInfo"]
        old_pid = first["WorkerRunningInfo"]["pid"]
    saved = json.loads((tmp_path / "workers.json").read_text())
    assert [w["WorkerName"] for w in saved] == ["keeper"]
    assert {d["Index"] for d in json.loads((tmp_path / "devices.json").read_text())} == {0, 1, 2}
    async with hypervisor(tmp_path) as http:
        workers = (await http.get("/api/v1/workers")).json()["data"]
        assert [w["WorkerInfo"]["WorkerUID"] for w in workers] == [first["WorkerUID"]]
        restored = workers[0]["WorkerInfo"]
        assert restored["AllocatedDevices"] == first["AllocatedDevices"]
        assert restored["WorkerRunningInfo"]["isRunning"] and restored["WorkerRunningInfo"]["pid"] != old_pid
        # the restored allocation still holds its device: a second big worker must go elsewhere
        second = (await http.post("/api/v1/workers", json={
            "name": "other", "requests": {"tflops": "300", "vram": "70Gi"}})).json()["data"]["WorkerInfo"]
        assert second["AllocatedDevices"] != first["AllocatedDevices"]


async def test_auto_without_a_driver_runs_with_no_devices(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("an NVIDIA driver library is installed here; this test needs a machine without one")
    async with hypervisor(tmp_path, devices="auto") as http:
        ready = (await http.get("/readyz")).json()
        assert ready["status"] == "ready"
        assert "no NVIDIA driver answered" in ready["conditions"][0]["message"]
        assert (await http.get("/api/v1/devices")).json() == {"data": []}
        response = await http.post("/api/v1/workers", json={"name": "w", "requests": {"tflops": "1", "vram": "1Gi"}})
        assert response.status_code == 409 and "no devices" in response.json()["error"]


def _alive(pid: int) -> bool:
    stat = ProcFS().stat(pid)
    return stat is not None and stat.alive


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not a worker (no marker), leading its own group."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(timeout=5)


def _record_group(state: Path, group: Any) -> None:
    saved = json.loads((state / "workers.json").read_text())
    saved[0]["WorkerRunningInfo"]["processGroup"] = group
    (state / "workers.json").write_text(json.dumps(saved))


async def test_a_recorded_group_is_adopted_only_when_its_leader_is_the_same_process(
        tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    async with hypervisor(tmp_path) as http:
        created = await http.post("/api/v1/workers", json={"name": "job", "command": ["sleep", "60"]})
        assert created.status_code == 201, created.text
    saved = json.loads((tmp_path / "workers.json").read_text())
    group = saved[0]["WorkerRunningInfo"]["processGroup"]
    assert group["pgid"] == created.json()["data"]["WorkerInfo"]["WorkerRunningInfo"]["pid"]
    assert group["leaderStartTime"] > 0
    stat = ProcFS().stat(stranger.pid)
    assert stat is not None

    # the PID was reused by a stranger (another start time): start afresh, leave the stranger alone
    for record in ({"pgid": stranger.pid, "leaderStartTime": stat.start_time + 1}, {"pgid": "x"}, "junk"):
        _record_group(tmp_path, record)
        async with hypervisor(tmp_path) as http:
            running = (await http.get("/api/v1/workers/job")).json()["data"]["allocation"]["WorkerInfo"][
                "WorkerRunningInfo"]
            assert running["isRunning"] and running["pid"] != stranger.pid
        assert _alive(stranger.pid), f"{record}: a process that is not ours was signalled"
        assert not _alive(running["pid"])

    # the recorded leader is still the same process: adopted, not started again; stopped with tfusion
    _record_group(tmp_path, {"pgid": stranger.pid, "leaderStartTime": stat.start_time})
    async with hypervisor(tmp_path) as http:
        running = (await http.get("/api/v1/workers/job")).json()["data"]["allocation"]["WorkerInfo"][
            "WorkerRunningInfo"]
        assert running["isRunning"] and running["pid"] == stranger.pid
        assert not [pid for pid in ProcFS().pids() if ProcFS().environ(pid).get("TF_LOCAL_WORKER")
                    == f"{tmp_path.resolve()}#{saved[0]['WorkerUID']}"], "no second copy was started"
    stranger.wait(timeout=5)
    assert stranger.returncode == -signal.SIGTERM


async def test_worker_output_and_delete_by_name(tmp_path: Path) -> None:
    async with hypervisor(tmp_path) as http:
        uids = {}
        for namespace in ("team-a", "team-b"):
            created = await http.post("/api/v1/workers", json={
                "name": "same", "namespace": namespace,
                "command": ["sh", "-c", f"echo hello {namespace}; exec sleep 60"]})
            assert created.status_code == 201, created.text
            uids[namespace] = created.json()["data"]["WorkerInfo"]["WorkerUID"]

        def logged(namespace: str) -> bool:
            log_file = tmp_path / "logs" / namespace / "worker-same.log"
            return log_file.exists() and f"hello {namespace}" in log_file.read_text()

        await eventually(lambda: anyio.to_thread.run_sync(lambda: logged("team-a") and logged("team-b")))
        ambiguous = await http.delete("/api/v1/workers/same")
        assert ambiguous.status_code == 409, ambiguous.text
        assert ambiguous.json()["field"] == "worker_id"
        assert ambiguous.json()["reasons"] == [f"{ns}/same: {uid}" for ns, uid in sorted(uids.items())]
        assert (await http.delete(f"/api/v1/workers/{uids['team-a']}")).status_code == 200
        by_name = await http.delete("/api/v1/workers/same")
        assert by_name.status_code == 200 and by_name.json()["data"]["worker_uid"] == uids["team-b"]
        assert (await http.get("/api/v1/workers")).json() == {"data": []}
