"""The NVML backend running nvidia-ml-py's real code against a fake libnvidia-ml.so built from C."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from tests import fake_nvml
from tfusion.hypervisor.devices import NoDevicesBackend, open_backend
from tfusion.hypervisor.devices.backend import DeviceBackendError
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable
from tfusion.hypervisor.devices.nvml import NvmlBackend, cores_per_sm, pci_key, sysfs_numa_node, topology_tier
from tfusion.hypervisor.devices.partitions import PartitionError, PartitionProfile
from tfusion.hypervisor.devices.registry import DeviceRegistry

pytestmark = pytest.mark.anyio

A100 = fake_nvml.GPU0_UUID.lower()
H100 = fake_nvml.GPU1_UUID.lower()


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if fake_nvml.gcc() is None:
        pytest.skip("no C compiler (gcc/cc) on PATH: cannot build the fake libnvidia-ml.so")
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def nvml(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """pynvml bound to the fake library for one test (its knobs reset)."""
    for knob in ("FAKE_NVML_GPU_COUNT", "FAKE_NVML_INIT_ERROR", "FAKE_NVML_LOST_INDEX", "FAKE_NVML_XID",
                 "FAKE_NVML_NO_EVENTS", "FAKE_NVML_GONE_INDEX", "FAKE_NVML_NVLINKS", "FAKE_NVML_TOPOLOGY",
                 "FAKE_NVML_MIG"):
        monkeypatch.delenv(knob, raising=False)
    saved = fake_nvml.use_in_process(fake_lib)
    try:
        yield fake_lib
    finally:
        fake_nvml.restore(saved)


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    numa = tmp_path / "bus/pci/devices/0000:86:00.0/numa_node"
    numa.parent.mkdir(parents=True)
    numa.write_text("1\n")
    return tmp_path


async def test_discovery_reads_every_field(nvml: Path, sys_root: Path) -> None:
    backend = NvmlBackend(sys_root=sys_root)
    await backend.open()
    try:
        registry = DeviceRegistry(backend, GpuInfoTable())
        await registry.discover()
        a100, h100 = registry.devices()
    finally:
        await backend.close()
    assert (a100.uuid, a100.native_uuid, a100.model) == (A100, fake_nvml.GPU0_UUID, "NVIDIA A100-SXM4-80GB")
    assert (h100.uuid, h100.model) == (H100, "NVIDIA H100 80GB HBM3")
    assert (a100.index, h100.index) == (0, 1)
    assert (a100.total_memory_bytes, h100.total_memory_bytes) == (85899345920, 85520809984)
    assert (a100.pci_bus_id, h100.pci_bus_id) == ("00000000:3B:00.0", "00000000:86:00.0")
    assert (a100.compute_capability, h100.compute_capability) == ("8.0", "9.0")
    assert (a100.sm_count, h100.sm_count) == (108, 132)  # cores / cores-per-SM
    assert a100.numa_node == 0
    assert h100.numa_node == 1  # NVML says NotSupported: from sysfs
    assert a100.driver_version == "550.54.15"
    assert (a100.max_tflops, h100.max_tflops) == (312, 989)
    assert a100.healthy and h100.healthy
    assert a100.to_wire()["UUID"] == A100 and a100.to_wire()["Healthy"] is True


@pytest.mark.parametrize(("knobs", "tier", "link_type"), [
    ({}, 2, "System"),  # the fake's two GPUs hang off different CPUs
    ({"FAKE_NVML_TOPOLOGY": "10"}, 1, "PCIeSwitch"),
    ({"FAKE_NVML_TOPOLOGY": "30"}, 1, "HostBridge"),
    ({"FAKE_NVML_TOPOLOGY": "40"}, 1, "NUMANode"),
    ({"FAKE_NVML_TOPOLOGY": "-1"}, 3, "Unknown"),  # the driver does not answer: unknown, still healthy
    ({"FAKE_NVML_NVLINKS": "2", "FAKE_NVML_TOPOLOGY": "50"}, 0, "NVLink"),  # NVLink wins over the PCIe path
])
async def test_discovery_reads_the_topology(nvml: Path, sys_root: Path, monkeypatch: pytest.MonkeyPatch,
                                            knobs: dict[str, str], tier: int, link_type: str) -> None:
    for knob, value in knobs.items():
        monkeypatch.setenv(knob, value)
    backend = NvmlBackend(sys_root=sys_root)
    await backend.open()
    try:
        a100, h100 = await backend.discover()
    finally:
        await backend.close()
    assert [(link.peer_uuid, link.tier, link.link_type) for link in a100.topology] == [(H100, tier, link_type)]
    assert [(link.peer_uuid, link.tier, link.link_type) for link in h100.topology] == [(A100, tier, link_type)]
    assert a100.healthy and h100.healthy
    assert (a100.numa_node, h100.numa_node) == (0, 1)


async def test_one_gpu_has_no_topology(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_GPU_COUNT", "1")
    backend = NvmlBackend()
    await backend.open()
    try:
        (only,) = await backend.discover()
    finally:
        await backend.close()
    assert only.topology == ()


def test_pci_addresses_compare_in_one_spelling() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00.0") == "0000:3b:00.0"
    assert topology_tier(None) == (3, "Unknown") and topology_tier(77) == (3, "Unknown")


async def test_metrics_and_processes(nvml: Path) -> None:
    backend = NvmlBackend()
    await backend.open()
    try:
        metrics = {m.uuid: m for m in await backend.read_metrics()}
        processes = await backend.list_processes()
    finally:
        await backend.close()
    assert metrics[A100].utilization_percent == 42
    assert metrics[A100].memory_used_bytes == 1024**3
    assert metrics[A100].power_watts == pytest.approx(250.123)
    assert metrics[A100].temperature_celsius == 51
    assert (metrics[A100].pcie_rx_bytes, metrics[A100].pcie_tx_bytes) == (1000 * 1024, 500 * 1024)
    assert metrics[H100].utilization_percent == 7
    assert [(p.pid, p.device_uuid, p.used_memory_bytes, p.compute_percent) for p in processes] == [
        (4242, A100, 1024**3, 37.0), (5151, H100, 2 * 1024**3, 5.0), (5252, H100, 512 * 1024**2, 2.0)]


async def test_a_lost_gpu_is_unhealthy_and_says_why(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_LOST_INDEX", "1")
    backend = NvmlBackend()
    await backend.open()
    try:
        a100, h100 = await backend.discover()
        metrics = {m.uuid: m for m in await backend.read_metrics()}
    finally:
        await backend.close()
    assert a100.healthy
    assert not h100.healthy and "GPU is lost" in h100.health_message
    assert h100.to_wire()["Healthy"] is False
    assert metrics[H100].utilization_percent == 0  # unreadable, not fatal for the sample


async def test_a_gpu_without_a_handle_is_left_out(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_GONE_INDEX", "0")
    backend = NvmlBackend()
    await backend.open()
    try:
        assert [d.uuid for d in await backend.discover()] == [H100]
        assert [m.uuid for m in await backend.read_metrics()] == [H100]
        assert {p.device_uuid for p in await backend.list_processes()} == {H100}
    finally:
        await backend.close()


async def test_critical_xid_events_mark_the_device_unhealthy(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = NvmlBackend()
    await backend.open()
    registry = DeviceRegistry(backend)
    await registry.discover()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(registry.run_health_watch)
            monkeypatch.setenv("FAKE_NVML_XID", "1:13")  # an application error: ignored
            await anyio.sleep(0.6)
            assert all(d.healthy for d in registry.devices())
            monkeypatch.setenv("FAKE_NVML_XID", "0:79")  # fell off the bus
            with anyio.fail_after(5):
                while registry.get(A100).healthy:  # type: ignore[union-attr]
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    finally:
        await backend.close()
    assert registry.get(A100).health_message == "XID 79"  # type: ignore[union-attr]
    assert registry.get(H100).healthy  # type: ignore[union-attr]


async def test_without_event_support_the_watch_just_returns(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_NO_EVENTS", "1")
    backend = NvmlBackend()
    await backend.open()
    try:
        with anyio.fail_after(3):
            await backend.watch_health(lambda: anyio.sleep(0))
    finally:
        await backend.close()


async def test_rediscovery_sees_a_vanished_gpu(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = NvmlBackend()
    await backend.open()
    try:
        registry = DeviceRegistry(backend)
        await registry.discover()
        monkeypatch.setenv("FAKE_NVML_GPU_COUNT", "1")
        changes = await registry.discover()
    finally:
        await backend.close()
    assert [d.uuid for d in changes.removed] == [H100]


async def test_auto_runs_without_devices_when_the_driver_does_not_answer(
        nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_INIT_ERROR", "1")
    backend = await open_backend("auto", node_name="n", table=GpuInfoTable())
    assert isinstance(backend, NoDevicesBackend)
    assert "Driver Not Loaded" in backend.unavailable_reason
    with pytest.raises(DeviceBackendError, match="NVML did not initialise"):
        await open_backend("nvml", node_name="n", table=GpuInfoTable())
    monkeypatch.delenv("FAKE_NVML_INIT_ERROR")
    backend = await open_backend("auto", node_name="n", table=GpuInfoTable())
    try:
        assert backend.name == "nvml" and len(await backend.discover()) == 2
    finally:
        await backend.close()


def test_pynvml_finds_the_fake_library_through_the_loader(fake_lib: Path) -> None:
    """In a fresh process pynvml's own CDLL("libnvidia-ml.so.1") loads the fake via LD_LIBRARY_PATH."""
    script = (
        "import anyio, json\n"
        "from tfusion.hypervisor.devices.nvml import NvmlBackend\n"
        "async def main():\n"
        "    b = NvmlBackend(); await b.open()\n"
        "    print(json.dumps([d.to_wire() for d in await b.discover()])); await b.close()\n"
        "anyio.run(main)\n")
    result = subprocess.run([sys.executable, "-c", script], env=fake_nvml.subprocess_env(fake_lib),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    devices = json.loads(result.stdout)
    assert [(d["UUID"], d["Model"]) for d in devices] == [(A100, "NVIDIA A100-SXM4-80GB"),
                                                          (H100, "NVIDIA H100 80GB HBM3")]


def test_cores_per_sm_and_sysfs_fallback(tmp_path: Path) -> None:
    assert (cores_per_sm(8, 0), cores_per_sm(8, 6), cores_per_sm(9, 0), cores_per_sm(7, 5)) == (64, 128, 128, 64)
    assert cores_per_sm(1, 0) == 0
    assert sysfs_numa_node("00000000:AF:00.0", tmp_path) == -1
    assert sysfs_numa_node("", tmp_path) == -1


@pytest.fixture
async def mig_backend(nvml: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NvmlBackend]:
    """The NVML backend on the fake with MIG mode on for the A100 (GPU 0) only; whatever a test leaves
    on the fake's GPU is destroyed afterwards (the library's state lives as long as the process)."""
    monkeypatch.setenv("FAKE_NVML_MIG", "0")
    backend = NvmlBackend()
    await backend.open()
    try:
        yield backend
    finally:
        for part in await backend.list_partitions(A100):
            await backend.remove_partition(A100, part.uuid)
        await backend.close()


async def test_mig_partitions_through_the_real_binding(mig_backend: NvmlBackend) -> None:
    placed = await mig_backend.create_partition(A100, PartitionProfile("1g.10gb", 19), 3)
    assert placed.uuid.startswith("MIG-") and placed.parent_uuid == A100
    assert (placed.profile_name, placed.profile_id, placed.slot_start, placed.slot_end) == ("1g.10gb", 19, 3, 4)
    assert placed.memory_bytes == 9856 * 1024 * 1024  # the profile's memorySizeMB
    # by name only (canonical form, mig- prefix): NVML places it; 3g.40gb can only go to slot 4 now
    anywhere = await mig_backend.create_partition(A100, PartitionProfile("mig-3g-40gb"), None)
    assert (anywhere.profile_id, anywhere.slot_start, anywhere.slot_end) == (9, 4, 8)
    assert anywhere.gpu_instance_id != placed.gpu_instance_id
    assert [p.uuid for p in await mig_backend.list_partitions(A100)] == [placed.uuid, anywhere.uuid]
    await mig_backend.remove_partition(A100, placed.uuid)
    await mig_backend.remove_partition(A100, placed.uuid)  # already gone: nothing to do, no error
    assert [p.uuid for p in await mig_backend.list_partitions(A100)] == [anywhere.uuid]
    again = await mig_backend.create_partition(A100, PartitionProfile("2g.20gb", 14), 2)  # the freed slots
    assert (again.slot_start, again.slot_end) == (2, 4)


async def test_mig_failures_are_clear_errors(mig_backend: NvmlBackend) -> None:
    await mig_backend.create_partition(A100, PartitionProfile("1g.10gb", 19), 3)
    with pytest.raises(PartitionError, match=r"creating MIG 2g\.20gb at slot 2 failed: NVML says Insufficient"):
        await mig_backend.create_partition(A100, PartitionProfile("2g.20gb"), 2)  # overlaps slot 3
    with pytest.raises(PartitionError, match=r"2g\.20gb cannot start at slot 1; allowed start slots: 0, 2, 4"):
        await mig_backend.create_partition(A100, PartitionProfile("2g.20gb"), 1)
    with pytest.raises(PartitionError, match=r"no MIG profile 9g\.1gb; it offers: 1g\.10gb \(id 19\)"):
        await mig_backend.create_partition(A100, PartitionProfile("9g.1gb"), None)
    with pytest.raises(PartitionError, match=r"GPU gpu-9b1d.*: MIG mode is off; turn it on first"):
        await mig_backend.create_partition(H100, PartitionProfile("1g.10gb"), None)
    with pytest.raises(PartitionError, match="no NVIDIA GPU GPU-nope on this node"):
        await mig_backend.create_partition("GPU-nope", PartitionProfile("1g.10gb"), None)
    assert await mig_backend.list_partitions(H100) == []  # MIG off: no partitions
    assert len(await mig_backend.list_partitions(A100)) == 1  # the refused ones left nothing behind
