"""`tfusion --role=hypervisor` as a real process, talked to over HTTP like curl would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import fake_nvml
from tests.helpers.hypervisor_process import free_port, start, stop, wait_ready


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        stop(proc)


def test_local_hypervisor_process(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    args = ["--role=hypervisor", "--backend=local", "--devices=sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB",
            "--port", str(port), "--state-dir", str(state), "--metrics-output-path", str(tmp_path / "m.log"),
            "--node-name", "e2e-box"]
    proc = start(args, tmp_path / "log1.txt")
    processes.append(proc)
    wait_ready(proc, url, tmp_path / "log1.txt")
    devices = httpx.get(f"{url}/api/v1/devices").json()["data"]
    assert [(d["Model"], d["Healthy"]) for d in devices] == [
        ("NVIDIA A100-SXM4-80GB", True), ("NVIDIA A100-SXM4-80GB", True), ("NVIDIA H100 80GB HBM3", True)]
    marker = tmp_path / "ran.txt"
    created = httpx.post(f"{url}/api/v1/workers", json={
        "name": "job", "requests": {"tflops": "50", "vram": "4Gi"}, "gpuCount": 2,
        "command": f"sh -c 'echo $NVIDIA_VISIBLE_DEVICES > {marker}; exec sleep 60'"})
    assert created.status_code == 201, created.text
    info = created.json()["data"]["WorkerInfo"]
    assert len(info["AllocatedDevices"]) == 2
    worker_pid = info["WorkerRunningInfo"]["pid"]
    deadline = time.monotonic() + 5
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(marker.read_text().strip().split(",")) == sorted("GPU-" + u[4:] for u in info["AllocatedDevices"])
    assert stop(proc) == 0
    with pytest.raises(ProcessLookupError):  # the worker went down with the hypervisor
        os.kill(worker_pid, 0)

    proc = start(args, tmp_path / "log2.txt")  # same state dir: the worker comes back
    processes.append(proc)
    wait_ready(proc, url, tmp_path / "log2.txt")
    workers = httpx.get(f"{url}/api/v1/workers").json()["data"]
    assert [w["WorkerInfo"]["WorkerUID"] for w in workers] == [info["WorkerUID"]]
    assert httpx.delete(f"{url}/api/v1/workers/{info['WorkerUID']}").status_code == 200
    assert httpx.get(f"{url}/api/v1/workers").json() == {"data": []}


def test_nvml_hypervisor_process_on_the_fake_driver(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    if fake_nvml.gcc() is None:
        pytest.skip("no C compiler (gcc/cc) on PATH: cannot build the fake libnvidia-ml.so")
    lib = fake_nvml.build(tmp_path / "lib")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "log.txt"
    proc = start(["--role=hypervisor", "--backend=local", "--devices=nvml", "--port", str(port),
                  "--state-dir", str(tmp_path / "state"), "--metrics-output-path", str(tmp_path / "m.log")], log,
                 env=fake_nvml.subprocess_env(lib, FAKE_NVML_LOST_INDEX="1"))
    processes.append(proc)
    wait_ready(proc, url, log)
    devices = httpx.get(f"{url}/api/v1/devices").json()["data"]
    assert [(d["UUID"], d["Model"], d["MaxTflops"], d["Healthy"]) for d in devices] == [
        (fake_nvml.GPU0_UUID.lower(), "NVIDIA A100-SXM4-80GB", 312, True),
        (fake_nvml.GPU1_UUID.lower(), "NVIDIA H100 80GB HBM3", 989, False)]


@pytest.mark.parametrize(("args", "message"), [
    (["--devices=sim:2xNoSuchGPU"], "unknown GPU model 'NoSuchGPU'"),
    (["--devices=cuda"], "expected auto, nvml, or sim"),
    (["--backend=kubernetes", "--devices=sim:1xL4", "--kube", "/nonexistent/kubeconfig", "--node-name", "n"],
     "no kubeconfig file there"),
])
def test_bad_settings_exit_1_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "tfusion", "--role=hypervisor", "--backend=local", "--port", "0",
                             "--state-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
