"""Simulated accelerators for machines without GPUs: `--devices=sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB`.

Devices take their memory, SM count and compute capability from the gpu-info table, and UUIDs that
are stable for a node name (a hash of node name and index), so restarts and several simulated nodes
behave like real hardware. Load, health, presence and processes can be changed while running:
from Python (`set_load`, `set_processes`, `set_health`, `set_present`) or, for a separate process,
through a JSON load file that is re-read when it changes:

    {"devices": {"0": {"utilization": 40, "memoryUsedBytes": 1073741824, "powerWatts": 210,
                       "temperature": 55, "healthy": true, "present": true}},
     "processes": [{"pid": 1234, "device": 0, "memoryBytes": 1073741824, "computePercent": 30}]}

Device keys are indices or UUIDs.

A topology may follow the models, after `;`: `sim:4xA100-SXM4-80GB;nvlink=0-1,2-3;pcie-switch=0-1-2-3`
gives two NVLink pairs under one PCIe switch. Each group (indices joined by `-`, groups separated by `,`)
is fully connected: `nvlink` groups are tier 0, `pcie-switch` groups tier 1 (and share the NUMA node of
their first member); other pairs are tier 1 on the same NUMA node, tier 2 across NUMA nodes. Without a
topology part the devices report none (the allocator treats that as unknown).

A workload behind the soft limiter can be simulated too (`attach_limited_load`): it wants some
percent of the device and runs only on the tokens it gets, by the device mock's rule that one
kernel launch a second is one percent and costs one token (100 launches/s = 100 %). Each metrics
read lets it spend what it got since the last read, so the device's utilisation follows the
limiter's refill rate — which is what the rate limiter's closed-loop test needs.

A100 (80 and 40 GB) and H100 80 GB devices can be partitioned (`create_partition`) as MIG partitions
are: the profiles of NVIDIA's tables with their slot geometry (`partitions.MIG_MODELS`), overlapping
or misplaced slots refused, and partition UUIDs derived from the GPU, the profile and the start slot,
so the same partition gets the same UUID again.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from tfusion.api.accessors import section
from tfusion.hypervisor.devices.backend import DeviceBackendError, HealthChanged
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable, GpuModel
from tfusion.hypervisor.devices.model import (
    LINK_NUMA_NODE,
    LINK_NVLINK,
    LINK_PCIE_SWITCH,
    LINK_SYSTEM,
    TIER_CROSS_NUMA,
    TIER_NVLINK,
    TIER_SAME_NUMA,
    DeviceInfo,
    DeviceMetrics,
    GpuProcess,
    TopologyLink,
    VirtualizationCapabilities,
    wire_uuid,
)
from tfusion.hypervisor.devices.partitions import (
    MIG_MODELS,
    MigLayout,
    Partition,
    PartitionError,
    PartitionProfile,
    find_shape,
    mig_family,
)

log = logging.getLogger(__name__)

_SPEC_PART = re.compile(r"^(?:(\d+)\s*[xX*]\s*)?(.+)$")
SIM_DRIVER_VERSION = "550.54.15-sim"
_MAX_DEVICES = 64


@dataclass(frozen=True)
class SimDeviceSpec:
    model: GpuModel
    count: int


@dataclass(frozen=True)
class SimTopology:
    """The `;nvlink=…;pcie-switch=…` part of a sim spec: groups of device indices."""

    nvlink: tuple[frozenset[int], ...] = ()
    pcie_switch: tuple[frozenset[int], ...] = ()

    def same(self, groups: tuple[frozenset[int], ...], a: int, b: int) -> bool:
        return any(a in g and b in g for g in groups)


_TOPOLOGY_KEYS = ("nvlink", "pcie-switch")


def _body(spec: str) -> str:
    return spec[4:] if spec.startswith("sim:") else spec


def parse_sim_topology(spec: str, total: int) -> SimTopology | None:
    """The topology part of a sim spec (None when there is none); indices must be below `total`."""
    parts = [p.strip() for p in _body(spec).split(";")[1:] if p.strip()]
    if not parts:
        return None
    found: dict[str, tuple[frozenset[int], ...]] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _TOPOLOGY_KEYS:
            raise DeviceBackendError(f"--devices: {part!r}: expected nvlink=<i-j,...> or pcie-switch=<i-j-k,...>")
        groups: list[frozenset[int]] = []
        for text in (g.strip() for g in value.split(",") if g.strip()):
            try:
                members = frozenset(int(i) for i in text.split("-"))
            except ValueError:
                raise DeviceBackendError(f"--devices: {key} group {text!r}: indices joined by '-', "
                                         "e.g. 0-1") from None
            if len(members) < 2 or any(not 0 <= i < total for i in members):
                raise DeviceBackendError(f"--devices: {key} group {text!r}: at least two indices "
                                         f"from 0 to {total - 1}")
            groups.append(members)
        found[key] = tuple(groups)
    return SimTopology(nvlink=found.get("nvlink", ()), pcie_switch=found.get("pcie-switch", ()))


def sim_topology_links(topology: SimTopology, index: int, numa: list[int],
                       uuids: list[str]) -> tuple[TopologyLink, ...]:
    """Device `index`'s links to every other simulated device."""
    links: list[TopologyLink] = []
    for peer, peer_uuid in enumerate(uuids):
        if peer == index:
            continue
        if topology.same(topology.nvlink, index, peer):
            links.append(TopologyLink(peer_uuid, TIER_NVLINK, LINK_NVLINK))
        elif topology.same(topology.pcie_switch, index, peer):
            links.append(TopologyLink(peer_uuid, TIER_SAME_NUMA, LINK_PCIE_SWITCH))
        elif numa[index] == numa[peer]:
            links.append(TopologyLink(peer_uuid, TIER_SAME_NUMA, LINK_NUMA_NODE))
        else:
            links.append(TopologyLink(peer_uuid, TIER_CROSS_NUMA, LINK_SYSTEM))
    return tuple(links)


def parse_sim_spec(spec: str, table: GpuInfoTable | None = None) -> list[SimDeviceSpec]:
    """`2xA100-SXM4-80GB,1xH100-SXM5-80GB` (the `sim:` prefix is optional) to model rows; a topology
    part after `;` is read by `parse_sim_topology`."""
    table = table or GpuInfoTable()
    body = _body(spec).split(";")[0]
    parts = [p.strip() for p in body.split(",") if p.strip()]
    if not parts:
        raise DeviceBackendError(f"--devices={spec!r}: expected sim:<count>x<model>[,...], "
                                 "e.g. sim:2xA100-SXM4-80GB,1xH100-SXM5-80GB")
    result: list[SimDeviceSpec] = []
    for part in parts:
        match = _SPEC_PART.match(part)
        assert match is not None
        count = int(match.group(1) or 1)
        row = table.find(match.group(2).strip())
        if row is None or not row.memory_mib:
            raise DeviceBackendError(
                f"--devices: unknown GPU model {match.group(2).strip()!r} in {part!r}; known models: "
                + ", ".join(sorted({r.aliases[0] if r.aliases else r.model for r in _known_rows()})))
        if count <= 0:
            raise DeviceBackendError(f"--devices: count must be positive in {part!r}")
        result.append(SimDeviceSpec(row, count))
    if sum(s.count for s in result) > _MAX_DEVICES:
        raise DeviceBackendError(f"--devices: at most {_MAX_DEVICES} simulated devices per node")
    return result


def _known_rows() -> tuple[GpuModel, ...]:
    from tfusion.hypervisor.devices.gpu_info import shipped_models

    return shipped_models()


def sim_uuid(node_name: str, index: int) -> str:
    digest = hashlib.sha256(f"tfusion-sim/{node_name}/{index}".encode()).hexdigest()
    return f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def sim_partition_uuid(gpu_uuid: str, profile_id: int, start: int) -> str:
    digest = hashlib.sha256(f"tfusion-sim-mig/{gpu_uuid}/{profile_id}/{start}".encode()).hexdigest()
    return f"MIG-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@dataclass
class SimLoad:
    utilization: float = 0.0
    memory_used_bytes: int = 0
    power_watts: float | None = None
    temperature: float | None = None
    pcie_rx_bytes: int = 0
    pcie_tx_bytes: int = 0
    healthy: bool = True
    health_message: str = ""
    present: bool = True


@dataclass
class LimitedLoad:
    """A simulated workload on one device behind the soft limiter: it wants `demand_percent` of the
    device; `take_tokens(want)` returns how many of the `want` tokens it got (1 token = 1 % for 1 s)."""

    demand_percent: float
    take_tokens: Callable[[float], float]


@dataclass
class _SimDevice:
    info: DeviceInfo
    load: SimLoad = field(default_factory=SimLoad)
    limited: list[LimitedLoad] = field(default_factory=list)
    limited_percent: float = 0.0  # what the limited loads used over the last interval
    mig: MigLayout | None = None  # None: the model cannot be partitioned
    partitions: dict[str, Partition] = field(default_factory=dict)  # uuid -> partition


class SimBackend:
    """Simulated devices for one node."""

    name = "sim"
    unavailable_reason = ""

    def __init__(self, spec: str, node_name: str, *, load_file: Path | None = None,
                 table: GpuInfoTable | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._clock = clock
        self._last_run = clock()
        self._devices: list[_SimDevice] = []
        index = 0
        specs = parse_sim_spec(spec, table)
        total = sum(s.count for s in specs)
        topology = parse_sim_topology(spec, total)
        numa = [i * 2 // total for i in range(total)]
        for group in topology.pcie_switch if topology else ():
            for member in group:
                numa[member] = numa[min(group)]
        uuids = [wire_uuid(sim_uuid(node_name, i)) for i in range(total)]
        for item in specs:
            for _ in range(item.count):
                row = item.model
                self._devices.append(_SimDevice(DeviceInfo(
                    native_uuid=sim_uuid(node_name, index), vendor=row.vendor, model=row.full_model_name,
                    index=index, numa_node=numa[index],
                    topology=sim_topology_links(topology, index, numa, uuids) if topology else (),
                    total_memory_bytes=row.memory_mib * 1024 * 1024,
                    pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
                    compute_capability=row.compute_capability, sm_count=row.sm_count,
                    driver_version=SIM_DRIVER_VERSION, device_nodes=(f"/dev/nvidia{index}",))))
                family = mig_family(row.full_model_name)
                if family is not None:
                    dev = self._devices[-1]
                    dev.mig = MigLayout(dev.info.uuid, MIG_MODELS[family])
                    dev.info = dev.info.replace(capabilities=VirtualizationCapabilities(
                        supports_partitioning=True, max_partitions=7))
                index += 1
        self._processes: list[GpuProcess] = []
        self._load_file = load_file
        self._load_mtime: float | None = None

    # --- scripting ---------------------------------------------------------------------------------

    def _find(self, key: int | str) -> _SimDevice:
        for dev in self._devices:
            if (isinstance(key, int) and dev.info.index == key) or (
                    isinstance(key, str) and (key.lower() == dev.info.uuid or key == str(dev.info.index))):
                return dev
        raise KeyError(f"no simulated device {key!r}")

    def uuids(self) -> list[str]:
        return [d.info.uuid for d in self._devices]

    def set_load(self, device: int | str, *, utilization: float | None = None,
                 memory_used_bytes: int | None = None, power_watts: float | None = None,
                 temperature: float | None = None, pcie_rx_bytes: int | None = None,
                 pcie_tx_bytes: int | None = None) -> None:
        load = self._find(device).load
        if utilization is not None:
            load.utilization = float(utilization)
        if memory_used_bytes is not None:
            load.memory_used_bytes = int(memory_used_bytes)
        if power_watts is not None:
            load.power_watts = float(power_watts)
        if temperature is not None:
            load.temperature = float(temperature)
        if pcie_rx_bytes is not None:
            load.pcie_rx_bytes = int(pcie_rx_bytes)
        if pcie_tx_bytes is not None:
            load.pcie_tx_bytes = int(pcie_tx_bytes)

    def set_health(self, device: int | str, healthy: bool, message: str = "") -> None:
        load = self._find(device).load
        load.healthy, load.health_message = healthy, ("" if healthy else message or "marked unhealthy")

    def set_present(self, device: int | str, present: bool) -> None:
        self._find(device).load.present = present

    def set_processes(self, processes: list[GpuProcess]) -> None:
        known = set(self.uuids())
        for proc in processes:
            if proc.device_uuid not in known:
                raise KeyError(f"no simulated device {proc.device_uuid!r}")
        self._processes = list(processes)

    def attach_limited_load(self, device: int | str, load: LimitedLoad) -> None:
        self._find(device).limited.append(load)

    def detach_limited_load(self, device: int | str, load: LimitedLoad) -> None:
        dev = self._find(device)
        dev.limited = [item for item in dev.limited if item is not load]
        if not dev.limited:
            dev.limited_percent = 0.0

    def _run_limited_loads(self) -> None:
        """Let each limited load spend the tokens it can get for the time since the last run."""
        now = self._clock()
        elapsed = now - self._last_run
        if elapsed <= 0:
            return
        self._last_run = now
        for dev in self._devices:
            if not dev.limited:
                continue
            used = sum(load.take_tokens(load.demand_percent * elapsed) for load in dev.limited)
            dev.limited_percent = min(100.0, used / elapsed)

    # --- load file ---------------------------------------------------------------------------------

    def _refresh_from_file(self) -> None:
        path = self._load_file
        if path is None:
            return
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._load_mtime:
            return
        self._load_mtime = mtime
        try:
            self._apply_load_doc(orjson.loads(path.read_bytes()))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring simulated load file %s: %s", path, exc)

    def _apply_load_doc(self, doc: dict[str, Any]) -> None:
        for key, raw in section(doc, "devices").items():
            dev_key: int | str = int(key) if str(key).isdigit() else str(key)
            self.set_load(dev_key, utilization=raw.get("utilization"),
                          memory_used_bytes=raw.get("memoryUsedBytes"), power_watts=raw.get("powerWatts"),
                          temperature=raw.get("temperature"), pcie_rx_bytes=raw.get("pcieRxBytes"),
                          pcie_tx_bytes=raw.get("pcieTxBytes"))
            if "healthy" in raw:
                self.set_health(dev_key, bool(raw["healthy"]), str(raw.get("healthMessage", "")))
            if "present" in raw:
                self.set_present(dev_key, bool(raw["present"]))
        procs = []
        for raw in doc.get("processes") or []:
            dev_key = raw["device"]
            dev = self._find(int(dev_key) if str(dev_key).isdigit() else str(dev_key))
            procs.append(GpuProcess(pid=int(raw["pid"]), device_uuid=dev.info.uuid,
                                    used_memory_bytes=int(raw.get("memoryBytes", 0)),
                                    compute_percent=float(raw.get("computePercent", 0))))
        self._processes = procs

    # --- DeviceBackend -----------------------------------------------------------------------------

    async def open(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def discover(self) -> list[DeviceInfo]:
        await anyio.lowlevel.checkpoint()
        self._refresh_from_file()
        return [d.info.replace(healthy=d.load.healthy, health_message=d.load.health_message)
                for d in self._devices if d.load.present]

    async def read_metrics(self) -> list[DeviceMetrics]:
        await anyio.lowlevel.checkpoint()
        self._refresh_from_file()
        self._run_limited_loads()
        result = []
        for dev in self._devices:
            if not dev.load.present:
                continue
            load = dev.load
            proc_mem = sum(p.used_memory_bytes for p in self._processes if p.device_uuid == dev.info.uuid)
            util = min(100.0, load.utilization + dev.limited_percent)
            result.append(DeviceMetrics(
                uuid=dev.info.uuid, utilization_percent=util,
                memory_used_bytes=max(load.memory_used_bytes, proc_mem),
                power_watts=load.power_watts if load.power_watts is not None else 60.0 + 3.4 * util,
                temperature_celsius=load.temperature if load.temperature is not None else 32.0 + 0.4 * util,
                pcie_rx_bytes=load.pcie_rx_bytes, pcie_tx_bytes=load.pcie_tx_bytes))
        return result

    async def list_processes(self) -> list[GpuProcess]:
        await anyio.lowlevel.checkpoint()
        self._refresh_from_file()
        present = {d.info.uuid for d in self._devices if d.load.present}
        return [p for p in self._processes if p.device_uuid in present]

    async def create_partition(self, gpu_uuid: str, profile: PartitionProfile, slot_start: int | None) -> Partition:
        await anyio.lowlevel.checkpoint()
        dev = self._partitionable(gpu_uuid)
        assert dev.mig is not None
        shape = find_shape(dev.mig.shapes, profile)
        if shape is None:
            raise PartitionError(f"GPU {dev.info.uuid} ({dev.info.model}) has no MIG profile {profile.describe()}; "
                                 f"its profiles: {', '.join(s.name for s in dev.mig.shapes)}")
        start = dev.mig.place(shape, slot_start)
        dev.mig.used[start] = shape
        part = Partition(uuid=sim_partition_uuid(dev.info.uuid, shape.profile_id, start), parent_uuid=dev.info.uuid,
                         profile_name=shape.name, profile_id=shape.profile_id, slot_start=start,
                         slot_end=start + shape.size, memory_bytes=shape.memory_mib * 1024 * 1024,
                         gpu_instance_id=start + 1, compute_instance_id=0)
        dev.partitions[part.uuid] = part
        return part

    async def remove_partition(self, gpu_uuid: str, partition_uuid: str) -> None:
        await anyio.lowlevel.checkpoint()
        dev = self._partitionable(gpu_uuid)
        part = dev.partitions.pop(partition_uuid, None)
        if part is not None and dev.mig is not None:
            dev.mig.used.pop(part.slot_start, None)

    async def list_partitions(self, gpu_uuid: str) -> list[Partition]:
        await anyio.lowlevel.checkpoint()
        dev = self._partitionable(gpu_uuid)
        return sorted(dev.partitions.values(), key=lambda p: p.slot_start)

    def _partitionable(self, gpu_uuid: str) -> _SimDevice:
        try:
            dev = self._find(gpu_uuid)
        except KeyError:
            raise PartitionError(f"no simulated GPU {gpu_uuid!r} on this node") from None
        if dev.mig is None:
            raise PartitionError(f"GPU {dev.info.uuid} ({dev.info.model}) does not support MIG partitions; "
                                 "simulated models that do: A100 (40 and 80 GB), H100 80 GB")
        return dev

    async def watch_health(self, changed: HealthChanged) -> None:
        """Poll the load file so health changes written there reach the registry without waiting
        for the next discovery."""
        if self._load_file is None:
            return
        last = [(d.load.healthy, d.load.present) for d in self._devices]
        while True:
            await anyio.sleep(1.0)
            self._refresh_from_file()
            now = [(d.load.healthy, d.load.present) for d in self._devices]
            if now != last:
                last = now
                await changed()
