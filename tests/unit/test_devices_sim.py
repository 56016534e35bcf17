"""The simulated device backend, the device registry, and allocation env building."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfusion.hypervisor.devices import NoDevicesBackend, open_backend
from tfusion.hypervisor.devices.backend import DeviceBackend, DeviceBackendError
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable
from tfusion.hypervisor.devices.model import DeviceInfo, GpuProcess
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.devices.sim import SimBackend, parse_sim_spec, parse_sim_topology, sim_uuid
from tfusion.hypervisor.workers.allocation import AllocationError, build_allocation, compute_up_limit
from tfusion.hypervisor.workers.model import WorkerAmounts, WorkerInfo

pytestmark = pytest.mark.anyio

SPEC = "sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB"


async def test_sim_devices_are_realistic_and_stable_per_node() -> None:
    sim = SimBackend(SPEC, "node-a")
    assert isinstance(sim, DeviceBackend)
    devices = await sim.discover()
    assert [d.model for d in devices] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["NVIDIA H100 80GB HBM3"]
    assert [d.index for d in devices] == [0, 1, 2]
    assert devices[0].total_memory_bytes == 80 * 1024**3
    assert devices[2].total_memory_bytes == 81559 * 1024**2
    assert devices[2].sm_count == 132 and devices[2].compute_capability == "9.0"
    assert all(d.healthy for d in devices)
    assert all(d.uuid == d.native_uuid.lower() and d.native_uuid.startswith("GPU-") for d in devices)
    again = await SimBackend(SPEC, "node-a").discover()
    other = await SimBackend(SPEC, "node-b").discover()
    assert [d.uuid for d in again] == [d.uuid for d in devices]
    assert not {d.uuid for d in other} & {d.uuid for d in devices}
    assert devices[1].native_uuid == sim_uuid("node-a", 1)


@pytest.mark.parametrize(("spec", "message"), [
    ("sim:", "expected sim:"),
    ("sim:2xNoSuchGPU", "unknown GPU model 'NoSuchGPU'"),
    ("sim:0xA100", "count must be positive"),
    ("sim:65xA100", "at most 64"),
])
def test_bad_sim_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(DeviceBackendError, match=message):
        parse_sim_spec(spec)


TOPOLOGY_SPEC = "sim:4xA100-SXM4-80GB;nvlink=0-1,2-3;pcie-switch=0-1-2-3"


async def test_sim_topology_two_nvlink_pairs_under_one_pcie_switch() -> None:
    devices = await SimBackend(TOPOLOGY_SPEC, "node-a").discover()
    uuids = [d.uuid for d in devices]
    assert [d.numa_node for d in devices] == [0, 0, 0, 0]  # one switch: one NUMA node
    links = {d.index: {(link.peer_uuid, link.tier, link.link_type) for link in d.topology} for d in devices}
    assert links[0] == {(uuids[1], 0, "NVLink"), (uuids[2], 1, "PCIeSwitch"), (uuids[3], 1, "PCIeSwitch")}
    assert links[3] == {(uuids[2], 0, "NVLink"), (uuids[0], 1, "PCIeSwitch"), (uuids[1], 1, "PCIeSwitch")}
    # without a switch, pairs across the two simulated NUMA nodes are tier 2
    split = await SimBackend("sim:4xA100-SXM4-80GB;nvlink=0-1", "node-a").discover()
    tiers = {(link.peer_uuid, link.tier, link.link_type) for link in split[1].topology}
    assert tiers == {(split[0].uuid, 0, "NVLink"), (split[2].uuid, 2, "System"), (split[3].uuid, 2, "System")}
    # no topology part: none reported
    assert all(d.topology == () for d in await SimBackend(SPEC, "node-a").discover())


@pytest.mark.parametrize(("spec", "message"), [
    ("sim:4xA100;nvlink=0-4", "from 0 to 3"),
    ("sim:4xA100;nvlink=0", "at least two"),
    ("sim:4xA100;nvlink=a-b", "indices joined by '-'"),
    ("sim:4xA100;mesh=0-1", "expected nvlink="),
])
def test_bad_sim_topologies_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(DeviceBackendError, match=message):
        parse_sim_topology(spec, 4)


async def test_sim_load_processes_health_and_presence_are_scriptable() -> None:
    sim = SimBackend(SPEC, "n")
    uuids = sim.uuids()
    sim.set_load(0, utilization=55, memory_used_bytes=3 * 1024**3, power_watts=250, temperature=61,
                 pcie_rx_bytes=1000, pcie_tx_bytes=2000)
    sim.set_processes([GpuProcess(pid=101, device_uuid=uuids[2], used_memory_bytes=5 * 1024**3, compute_percent=20)])
    metrics = {m.uuid: m for m in await sim.read_metrics()}
    assert metrics[uuids[0]].utilization_percent == 55
    assert metrics[uuids[0]].memory_used_bytes == 3 * 1024**3
    assert (metrics[uuids[0]].power_watts, metrics[uuids[0]].temperature_celsius) == (250, 61)
    assert (metrics[uuids[0]].pcie_rx_bytes, metrics[uuids[0]].pcie_tx_bytes) == (1000, 2000)
    assert metrics[uuids[2]].memory_used_bytes == 5 * 1024**3  # processes count as used memory
    assert [p.pid for p in await sim.list_processes()] == [101]
    sim.set_health(1, False, "XID 79")
    sim.set_present(2, False)
    devices = {d.uuid: d for d in await sim.discover()}
    assert set(devices) == {uuids[0], uuids[1]}
    assert not devices[uuids[1]].healthy and devices[uuids[1]].health_message == "XID 79"
    assert await sim.list_processes() == []
    with pytest.raises(KeyError):
        sim.set_processes([GpuProcess(pid=1, device_uuid="gpu-nope")])


async def test_sim_load_file_drives_a_running_backend(tmp_path: Path) -> None:
    load = tmp_path / "sim-load.json"
    sim = SimBackend(SPEC, "n", load_file=load)
    load.write_text(json.dumps({"devices": {"0": {"utilization": 90, "healthy": False, "healthMessage": "hot"},
                                            sim.uuids()[2]: {"present": False}},
                                "processes": [{"pid": 7, "device": 1, "memoryBytes": 1024, "computePercent": 3}]}))
    devices = await sim.discover()
    assert [d.index for d in devices] == [0, 1]
    assert not devices[0].healthy and devices[0].health_message == "hot"
    assert (await sim.list_processes())[0].device_uuid == sim.uuids()[1]
    assert {m.uuid: m.utilization_percent for m in await sim.read_metrics()}[sim.uuids()[0]] == 90


async def test_registry_fills_tflops_and_reports_changes() -> None:
    sim = SimBackend(SPEC, "n")
    registry = DeviceRegistry(sim, GpuInfoTable())
    seen = []

    async def listener(changes: object) -> None:
        seen.append(changes)

    registry.subscribe(listener)
    first = await registry.discover()
    assert len(first.added) == 3 and not first.removed
    assert [d.max_tflops for d in registry.devices()] == [312, 312, 989]
    assert registry.get(sim.uuids()[0].upper()) is not None  # lookups are case-insensitive
    sim.set_present(0, False)
    sim.set_health(1, False, "lost")
    second = await registry.discover()
    assert [d.uuid for d in second.removed] == [sim.uuids()[0]]
    assert [d.uuid for d in second.updated] == [sim.uuids()[1]]
    assert len(seen) == 2
    sim.set_load(1, utilization=12)
    await registry.sample()
    assert registry.metrics()[sim.uuids()[1]].utilization_percent == 12


async def test_open_backend_selects_by_flag(tmp_path: Path) -> None:
    table = GpuInfoTable()
    assert (await open_backend(SPEC, node_name="n", table=table)).name == "sim"
    with pytest.raises(DeviceBackendError, match="expected auto, nvml, or sim"):
        await open_backend("cuda", node_name="n", table=table)


async def test_no_devices_backend_says_why() -> None:
    backend = NoDevicesBackend("no NVIDIA driver answered")
    registry = DeviceRegistry(backend)
    changes = await registry.discover()
    assert changes.current == () and registry.discovered
    assert backend.unavailable_reason == "no NVIDIA driver answered"


# --- allocation env (reference §4.2-4.3) -----------------------------------------------------------

def _device(index: int, vendor: str = "NVIDIA", tflops: float = 40.0) -> DeviceInfo:
    return DeviceInfo(native_uuid=f"GPU-0000000{index}-aaaa", vendor=vendor, model="m", index=index,
                      total_memory_bytes=16 * 1024**3, max_tflops=tflops, device_nodes=(f"/dev/nvidia{index}",))


def _worker(*ids: str, isolation: str = "soft", limits: WorkerAmounts | None = None,
            hard: int | None = None) -> WorkerInfo:
    return WorkerInfo(uid="u1", namespace="ns", name="w", allocated_devices=ids, isolation=isolation,
                      limits=limits or WorkerAmounts(), effective_hard_sm_percent=hard)


def test_nvidia_visible_devices_are_native_uuids_sorted_by_index() -> None:
    devices = {d.uuid: d for d in (_device(1), _device(0))}
    allocation = build_allocation(_worker("gpu-00000001-aaaa", "gpu-00000000-aaaa"), devices)
    assert allocation.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-aaaa,GPU-00000001-aaaa"}
    assert [d["hostPath"] for d in allocation.device_specs] == ["/dev/nvidia0", "/dev/nvidia1"]
    bare = build_allocation(_worker("gpu-00000001-aaaa"), devices, bare_process=True)
    assert bare.envs["CUDA_VISIBLE_DEVICES"] == "GPU-00000001-aaaa"


@pytest.mark.parametrize(("vendor", "expected"), [
    ("MooreThreads", {"MTHREADS_VISIBLE_DEVICES": "0,1", "MUSA_VISIBLE_DEVICES": "0,1"}),
    ("Ascend", {"ASCEND_VISIBLE_DEVICES": "0,1"}),
    ("PPU", {"PPU_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}),
    ("AMD", {}),
])
def test_other_vendors_pin_by_index(vendor: str, expected: dict[str, str]) -> None:
    devices = {d.uuid: d for d in (_device(0, vendor), _device(1, vendor))}
    assert build_allocation(_worker(*devices), devices).envs == expected


@pytest.mark.parametrize(("limits", "hard", "expected"), [
    (WorkerAmounts(compute_percent=30), None, "30"),
    (WorkerAmounts(tflops_milli=10_000), None, "25"),  # 10 of 40 TFLOPS
    (WorkerAmounts(tflops_milli=10_000), 15, "15"),  # the effective-hard-sm-percent annotation wins
    (WorkerAmounts(), None, "100"),
    (WorkerAmounts(tflops_milli=10_000), 150, "25"),  # out of range: ignored
])
def test_hard_mode_sm_percent(limits: WorkerAmounts, hard: int | None, expected: str) -> None:
    devices = {d.uuid: d for d in (_device(0),)}
    allocation = build_allocation(_worker("gpu-00000000-aaaa", isolation="hard", limits=limits, hard=hard), devices)
    assert allocation.envs["TF_CUDA_SM_PERCENT_LIMIT"] == expected


def test_up_limit_is_clamped_and_partitioned_is_not_pinned() -> None:
    device = _device(0, tflops=40)
    assert compute_up_limit(_worker(limits=WorkerAmounts(tflops_milli=400_000)), device) == 100
    assert compute_up_limit(_worker(limits=WorkerAmounts(tflops_milli=1)), device) == 1
    devices = {device.uuid: device}
    assert build_allocation(_worker(device.uuid, isolation="partitioned"), devices).envs == {}


def test_unknown_devices_are_an_error_naming_them() -> None:
    with pytest.raises(AllocationError, match="gpu-nope"):
        build_allocation(_worker("gpu-nope"), {})
