"""Soft workers: what the ERL steers one by (its own processes' SM utilisation when the device backend
reports per-process utilisation, else the whole device's) and how a local soft worker's LD_PRELOAD
gets the limiter library."""

from __future__ import annotations

from tfusion.hypervisor.devices.model import GpuProcess
from tfusion.hypervisor.limiter.soft import pod_utilisation
from tfusion.hypervisor.workers.local import preload_first

GPU, OTHER = "gpu-a", "gpu-b"


def proc(pid: int, percent: float, uuid: str = GPU) -> GpuProcess:
    return GpuProcess(pid=pid, device_uuid=uuid, compute_percent=percent)


def test_the_workers_own_processes_on_the_device_when_reported() -> None:
    ours = [proc(1, 25), proc(2, 5), proc(1, 40, OTHER)]
    everyone = [*ours, proc(3, 55)]
    assert pod_utilisation(GPU, 85, everyone, ours) == 30


def test_an_idle_worker_beside_a_busy_one_reads_idle() -> None:
    ours = [proc(1, 0)]
    assert pod_utilisation(GPU, 60, [*ours, proc(3, 60)], ours) == 0


def test_the_whole_device_when_no_process_reports_utilisation() -> None:
    assert pod_utilisation(GPU, 72, [proc(1, 0), proc(3, 0)], [proc(1, 0)]) == 72
    assert pod_utilisation(GPU, 72, [proc(3, 50, OTHER)], []) == 72  # another device's report does not count


def test_capped_at_the_whole_device() -> None:
    ours = [proc(1, 80), proc(2, 70)]
    assert pod_utilisation(GPU, 100, ours, ours) == 100


def test_the_limiter_library_is_preloaded_first_and_once() -> None:
    lib = "/opt/tf/libcuda_limiter.so"
    assert preload_first(lib, "") == lib
    assert preload_first(lib, "/a.so:/b.so") == f"{lib} /a.so /b.so"
    assert preload_first(lib, f"/a.so {lib}") == f"{lib} /a.so"
