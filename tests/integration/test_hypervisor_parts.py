"""Pieces of the hypervisor on their own: the process supervisor (real processes), /proc parsing on
a fake tree, and the metrics file lines."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tfusion.hypervisor.devices.model import GpuProcess
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.devices.sim import SimBackend
from tfusion.hypervisor.metrics import UsageRecorder, UsageSource, parse_extra_labels
from tfusion.hypervisor.workers.allocation import build_allocation
from tfusion.hypervisor.workers.model import RunningInfo, WorkerAllocation, WorkerAmounts, WorkerInfo
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.hypervisor.workers.supervisor import ProcessSupervisor, backoff_delay
from tfusion.metrics.points import Point, influx_line, json_line
from tfusion.metrics.sinks import MetricsOutput, RotatingFile

pytestmark = pytest.mark.anyio


def test_backoff_doubles_from_3_to_60_seconds() -> None:
    assert [backoff_delay(n) for n in range(1, 8)] == [3, 6, 12, 24, 48, 60, 60]


async def test_supervisor_restarts_an_exiting_process_with_backoff(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    sup = ProcessSupervisor(name="flaky", argv=["sh", "-c", f"echo run >> {runs}; exit 3"],
                            env={"PATH": "/usr/bin:/bin"}, cwd=None, log_dir=tmp_path / "logs",
                            backoff_start=0.05, backoff_max=0.2)
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        with anyio.fail_after(5):
            while sup.restarts < 4:
                await anyio.sleep(0.02)
        await sup.stop()
    # the fourth restart is counted after waits of 0.05, 0.1 and 0.2 s (a lower bound, not a speed goal)
    assert time.monotonic() - started >= 0.35
    assert sup.exit_code == 3 and runs.read_text().count("run") >= 4
    info = RunningInfo(executable="sh")
    sup.update(info)
    assert (info.is_running, info.exit_code, info.restarts) == (False, 3, sup.restarts)


async def test_supervisor_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    script = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    sup = ProcessSupervisor(name="stubborn", argv=["sh", "-c", script],
                            env={"PATH": "/usr/bin:/bin"}, cwd=None, log_dir=tmp_path, stop_grace=0.3)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        pid = sup.pid
        assert sup.running
        with anyio.fail_after(5):
            while "ready" not in (tmp_path / "worker-stubborn.log").read_text():
                await anyio.sleep(0.02)
        with anyio.fail_after(5):
            await sup.stop()
    assert not sup.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_missing_executable_is_reported_and_retried(tmp_path: Path) -> None:
    sup = ProcessSupervisor(name="ghost", argv=[str(tmp_path / "nope")], env={}, cwd=None, log_dir=tmp_path,
                            backoff_start=0.05)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        assert sup.exit_code == 127 and "cannot start" in sup.error
        await sup.stop()


def _fake_proc(root: Path, pid: int, *, env: dict[str, str], nspid: str, ppid: int, cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (d / "status").write_text(f"Name:\tpython\nPPid:\t{ppid}\nNSpid:\t{nspid}\n")
    (d / "cgroup").write_text(cgroup)


def test_procfs_maps_container_pids_and_pod_uids(tmp_path: Path) -> None:
    uid = "0b7c4a3e-1d2f-4a5b-8c9d-0e1f2a3b4c5d"
    _fake_proc(tmp_path, 100, env={"POD_NAMESPACE": "ns", "POD_NAME": "p", "CONTAINER_NAME": "main"},
               nspid="100\t7", ppid=1,
               cgroup=f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-abc.scope\n")
    _fake_proc(tmp_path, 200, env={"POD_NAMESPACE": "ns", "POD_NAME": "p", "CONTAINER_NAME": "side"},
               nspid="200\t7", ppid=100, cgroup="0::/\n")
    (tmp_path / "self").mkdir()
    proc = ProcFS(tmp_path)
    assert list(proc.pids()) == [100, 200]
    assert proc.find_container_process("ns", "p", "main", 7) == 100
    assert proc.find_container_process("ns", "p", "side", 7) == 200
    assert proc.find_container_process("ns", "p", "main", 8) is None
    assert proc.pod_uid(100) == uid and proc.pod_uid(200) == ""
    assert list(proc.ancestors(200)) == [100, 1]
    assert proc.environ(999) == {} and proc.container_pid(999) == 999


def test_influx_lines_escape_tags_and_mark_integers() -> None:
    sample = Point("tf_gpu_usage", {"uuid": "gpu-1", "node": "n 1,a=b", "pool": ""},
                   {"memory_bytes": 5, "compute_percentage": 12.5}, 1700000000123)
    assert influx_line(sample) == (  # an empty tag cannot be written: it is left out
        r"tf_gpu_usage,node=n\ 1\,a\=b,uuid=gpu-1 compute_percentage=12.5,memory_bytes=5i 1700000000123")
    assert json.loads(json_line(Point(sample.measure, sample.tags, sample.fields, 7))) == {
        "measure": "tf_gpu_usage", "tag": sample.tags, "field": sample.fields, "ts": 7}


async def test_metrics_file_has_device_and_worker_lines(tmp_path: Path) -> None:
    sim = SimBackend("sim:1xH100-SXM5-80GB", "n")
    registry = DeviceRegistry(sim)
    await registry.discover()
    device = registry.devices()[0]
    sim.set_load(0, utilization=50, power_watts=300)
    sim.set_processes([GpuProcess(pid=4242, device_uuid=device.uuid, used_memory_bytes=2 * 1024**3,
                                  compute_percent=25)])
    await registry.sample()
    worker = WorkerInfo(uid="w-1", namespace="ns", name="pod-a", allocated_devices=(device.uuid,),
                        limits=WorkerAmounts(vram_bytes=8 * 1024**3), workload_name="wl",
                        annotations={"example.com/team": "vision"})
    allocation = build_allocation(worker, {device.uuid: device})

    class Tracker:
        kind = "test"

        def allocations(self) -> list[WorkerAllocation]:
            return [allocation]

        def get(self, worker_id: str) -> WorkerAllocation | None:
            return allocation

        def running_info(self, uid: str) -> RunningInfo | None:
            return None

        def worker_for_pid(self, pid: int) -> str | None:
            return "w-1" if pid == 4242 else None

        def tracks(self, uid: str) -> bool:
            return True

    source = UsageSource(registry, Tracker(), node="n", pool_of=lambda uuid: "p",
                         extra_labels=parse_extra_labels('{"example.com/team": "team"}'))
    output = MetricsOutput(role="hypervisor", registry=CollectorRegistry(),
                           file=RotatingFile(tmp_path / "metrics.log"))
    assert await UsageRecorder(source, output).record_once() == 2
    gpu_line, worker_line = (tmp_path / "metrics.log").read_text().splitlines()
    assert gpu_line.startswith(f"tf_gpu_usage,node=n,pool=p,uuid={device.uuid} ")
    assert "compute_percentage=50.0" in gpu_line and "compute_tflops=494.5" in gpu_line
    assert "power_usage=300.0" in gpu_line and f"memory_bytes={2 * 1024**3}i" in gpu_line
    assert worker_line.startswith(
        f"tf_worker_usage,namespace=ns,node=n,pod_name=pod-a,pool=p,team=vision,uuid={device.uuid},worker=w-1,"
        "workload=wl ")
    assert "memory_percentage=25.0" in worker_line and "compute_percentage=25.0" in worker_line
    ts = int(gpu_line.rsplit(" ", 1)[1])
    assert abs(ts - time.time() * 1000) < 60_000  # milliseconds


def test_extra_labels_must_be_a_string_map() -> None:
    assert parse_extra_labels("") == {}
    with pytest.raises(ValueError, match="not JSON"):
        parse_extra_labels("{")
    with pytest.raises(ValueError, match="must map annotation keys"):
        parse_extra_labels('{"a": 1}')
