"""NVIDIA devices through NVML (nvidia-ml-py's `pynvml`).

Every NVML call is a blocking ctypes call, so each pass runs in a worker thread, one at a time
(a CapacityLimiter of 1): NVML handles are not worth sharing between threads. Calls a driver may not
have (FunctionNotFound) or a device may not support (NotSupported) fall back or give "unknown";
errors that mean the GPU is in trouble (lost, needs reset, unknown error) mark it unhealthy, and so
do critical XID events when the driver can deliver them.

MIG partitions are made as `nvidia-smi mig -cgi <profile> -C` makes them: a GPU instance of the
profile (at the asked placement when a slot is given, `nvmlDeviceCreateGpuInstanceWithPlacement`),
then one compute instance spanning it, then the MIG device whose UUID the container gets; removal
destroys the compute instance, then the GPU instance. MIG mode itself is left as the operator set it
(turning it on needs a GPU reset), and every NVML failure becomes a PartitionError naming the GPU.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pynvml

from tfusion.hypervisor.devices.backend import DeviceBackendError, HealthChanged
from tfusion.hypervisor.devices.model import (
    LINK_HOST_BRIDGE,
    LINK_INTERNAL,
    LINK_NUMA_NODE,
    LINK_NVLINK,
    LINK_PCIE_SWITCH,
    LINK_SYSTEM,
    LINK_UNKNOWN,
    NVIDIA,
    TIER_CROSS_NUMA,
    TIER_NVLINK,
    TIER_SAME_NUMA,
    TIER_UNKNOWN,
    DeviceInfo,
    DeviceMetrics,
    GpuProcess,
    TopologyLink,
    wire_uuid,
)
from tfusion.hypervisor.devices.partitions import Partition, PartitionError, PartitionProfile, canonical

log = logging.getLogger(__name__)

T = TypeVar("T")

#: errors that say the GPU itself is in trouble (as opposed to "this call is not available")
_FATAL_CODES = {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_UNKNOWN,
                pynvml.NVML_ERROR_CORRUPTED_INFOROM}
#: calls that are merely unavailable on this driver or device
_UNAVAILABLE_CODES = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                      pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NO_PERMISSION,
                      pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NO_DATA}
#: XIDs caused by applications, not the GPU (the same list NVIDIA's device plugin skips)
_APPLICATION_XIDS = {13, 31, 43, 45, 68, 109}
_XID_WAIT_MS = 200
_MIB = 1024 * 1024
#: a GPU instance's compute slices -> the compute-instance profile spanning all of them
_FULL_CI_PROFILE = {1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
                    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
                    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE}

#: CUDA cores per SM by compute capability (NVML reports cores, not SMs)
_CORES_PER_SM = {(2, 0): 32, (2, 1): 48, (3, -1): 192, (5, -1): 128, (6, 0): 64, (6, -1): 128, (7, -1): 64,
                 (8, 0): 64, (8, -1): 128, (9, -1): 128, (10, -1): 128, (11, -1): 128, (12, -1): 128}


#: NVML's common-ancestor level of two GPUs -> (tier, link type); NVLink is found separately
_TOPOLOGY_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: (TIER_NVLINK, LINK_INTERNAL),
    pynvml.NVML_TOPOLOGY_SINGLE: (TIER_SAME_NUMA, LINK_PCIE_SWITCH),
    pynvml.NVML_TOPOLOGY_MULTIPLE: (TIER_SAME_NUMA, LINK_PCIE_SWITCH),
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: (TIER_SAME_NUMA, LINK_HOST_BRIDGE),
    pynvml.NVML_TOPOLOGY_NODE: (TIER_SAME_NUMA, LINK_NUMA_NODE),
    pynvml.NVML_TOPOLOGY_SYSTEM: (TIER_CROSS_NUMA, LINK_SYSTEM),
}


def topology_tier(level: int | None) -> tuple[int, str]:
    """Tier and link type for an NVML common-ancestor level (None: the driver did not say)."""
    return _TOPOLOGY_LEVELS.get(level, (TIER_UNKNOWN, LINK_UNKNOWN)) if level is not None else (
        TIER_UNKNOWN, LINK_UNKNOWN)


def pci_key(bus_id: str) -> str:
    """A PCI address in one spelling: NVML writes an 8-digit domain in some places, 4 in others."""
    domain, sep, rest = bus_id.strip().lower().partition(":")
    if not sep:
        return bus_id.strip().lower()
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id.strip().lower()


def _remote_bus_id(handle: Any, link: int) -> str:
    return _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)


def _common_ancestor(handle: Any, peer: Any) -> int:
    return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, peer))


def cores_per_sm(major: int, minor: int) -> int:
    return _CORES_PER_SM.get((major, minor)) or _CORES_PER_SM.get((major, -1), 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sysfs_numa_node(pci_bus_id: str, sys_root: Path = Path("/sys")) -> int:
    """NUMA node of a PCI device from sysfs; NVML's bus id has an 8-digit domain, sysfs uses 4."""
    if not pci_bus_id:
        return -1
    domain, _, rest = pci_bus_id.lower().partition(":")
    bdf = f"{domain[-4:]}:{rest}"
    try:
        return int((sys_root / "bus/pci/devices" / bdf / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1


class _DeviceProbe:
    """Runs the per-device NVML calls of one pass and remembers what went wrong."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def get(self, what: str, call: Callable[[], T], default: T) -> T:
        try:
            return call()
        except pynvml.NVMLError as exc:
            if exc.value in _FATAL_CODES:
                self.problems.append(f"{what}: {exc}")
            elif exc.value not in _UNAVAILABLE_CODES:
                log.debug("NVML %s failed: %s", what, exc)
            return default


class NvmlBackend:
    """Devices from the NVIDIA driver."""

    name = "nvml"
    unavailable_reason = ""

    def __init__(self, *, sys_root: Path = Path("/sys")) -> None:
        self._limiter = anyio.CapacityLimiter(1)
        self._sys_root = sys_root
        self._xid_problems: dict[str, str] = {}  # lowercase uuid -> reason
        self._opened = False

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)

    async def open(self) -> None:
        try:
            await self._run(pynvml.nvmlInit)
        except pynvml.NVMLError as exc:
            raise DeviceBackendError(f"NVML did not initialise: {exc}") from exc
        self._opened = True

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            with anyio.CancelScope(shield=True):
                try:
                    await self._run(pynvml.nvmlShutdown)
                except pynvml.NVMLError as exc:
                    log.debug("nvmlShutdown: %s", exc)

    # --- discovery ---------------------------------------------------------------------------------

    async def discover(self) -> list[DeviceInfo]:
        try:
            return await self._run(self._discover_sync)
        except pynvml.NVMLError as exc:
            raise DeviceBackendError(f"NVML discovery failed: {exc}") from exc

    def _discover_sync(self) -> list[DeviceInfo]:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        found: list[tuple[Any, DeviceInfo]] = []
        for position in range(pynvml.nvmlDeviceGetCount()):
            try:
                found.append((pynvml.nvmlDeviceGetHandleByIndex(position), self._describe(position, driver)))
            except pynvml.NVMLError as exc:  # no handle or UUID: the device cannot be reported at all
                log.error("NVML device at position %d is unusable (%s); leaving it out", position, exc)
        return self._with_topology(found)

    @staticmethod
    def _nvlink_peers(handle: Any, by_bus: dict[str, str]) -> dict[str, int]:
        """UUIDs of the GPUs this one reaches over active NVLink links, with the link count of each
        (links to an NVSwitch or to a device that is not one of ours are left out)."""
        probe = _DeviceProbe()
        peers: dict[str, int] = {}
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError:
                break  # past the device's last link, or no NVLink at all
            if not active:
                continue
            remote = probe.get("nvlink remote", partial(_remote_bus_id, handle, link), "")
            peer = by_bus.get(pci_key(remote)) if remote else None
            if peer is not None:
                peers[peer] = peers.get(peer, 0) + 1
        return peers

    def _with_topology(self, found: list[tuple[Any, DeviceInfo]]) -> list[DeviceInfo]:
        """Each device with its paths to the others: NVLink where an active link reaches the peer,
        otherwise the tier of their common PCIe ancestor (`nvmlDeviceGetTopologyCommonAncestor`)."""
        if len(found) < 2:
            return [info for _, info in found]
        by_bus = {pci_key(info.pci_bus_id): info.uuid for _, info in found if info.pci_bus_id}
        nvlinks = {info.uuid: self._nvlink_peers(handle, by_bus) for handle, info in found}
        probe = _DeviceProbe()  # a failing topology call says nothing about the GPU's health
        result: list[DeviceInfo] = []
        for handle, info in found:
            links: list[TopologyLink] = []
            for peer_handle, peer in found:
                if peer.uuid == info.uuid:
                    continue
                if nvlinks[info.uuid].get(peer.uuid) or nvlinks[peer.uuid].get(info.uuid):
                    links.append(TopologyLink(peer.uuid, TIER_NVLINK, LINK_NVLINK))
                    continue
                level: int | None = probe.get("topology", partial(_common_ancestor, handle, peer_handle), None)
                links.append(TopologyLink(peer.uuid, *topology_tier(level)))
            result.append(info.replace(topology=tuple(links)))
        return result

    def _describe(self, position: int, driver: str) -> DeviceInfo:
        handle = pynvml.nvmlDeviceGetHandleByIndex(position)
        probe = _DeviceProbe()
        native_uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        name = probe.get("name", lambda: _text(pynvml.nvmlDeviceGetName(handle)), "")
        index = probe.get("index", lambda: int(pynvml.nvmlDeviceGetIndex(handle)), position)
        total = probe.get("memory", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), 0)
        bus_id = probe.get("pci info", lambda: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId), "")
        major, minor = probe.get("compute capability",
                                 lambda: tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)), (0, 0))
        numa = probe.get("numa node", lambda: int(pynvml.nvmlDeviceGetNumaNodeId(handle)), None)
        if numa is None:
            numa = sysfs_numa_node(bus_id, self._sys_root)
        cores = probe.get("gpu cores", lambda: int(pynvml.nvmlDeviceGetNumGpuCores(handle)), 0)
        per_sm = cores_per_sm(major, minor)
        problems = list(probe.problems)
        if wire_uuid(native_uuid) in self._xid_problems:
            problems.append(self._xid_problems[wire_uuid(native_uuid)])
        return DeviceInfo(
            native_uuid=native_uuid, vendor=NVIDIA, model=name, index=index, numa_node=numa,
            total_memory_bytes=total, pci_bus_id=bus_id,
            compute_capability=f"{major}.{minor}" if major else "",
            sm_count=cores // per_sm if per_sm and cores else 0, driver_version=driver,
            healthy=not problems, health_message="; ".join(problems),
            device_nodes=(f"/dev/nvidia{index}",))

    # --- metrics -----------------------------------------------------------------------------------

    async def read_metrics(self) -> list[DeviceMetrics]:
        try:
            return await self._run(self._metrics_sync)
        except pynvml.NVMLError as exc:
            raise DeviceBackendError(f"NVML metrics failed: {exc}") from exc

    def _metrics_sync(self) -> list[DeviceMetrics]:
        result = []
        for position in range(pynvml.nvmlDeviceGetCount()):
            try:
                result.append(self._device_metrics(pynvml.nvmlDeviceGetHandleByIndex(position)))
            except pynvml.NVMLError as exc:
                log.debug("no metrics for NVML device at position %d: %s", position, exc)
        return result

    @staticmethod
    def _device_metrics(handle: Any) -> DeviceMetrics:
        probe = _DeviceProbe()
        uuid = wire_uuid(_text(pynvml.nvmlDeviceGetUUID(handle)))
        util = probe.get("utilization", lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), 0.0)
        used = probe.get("memory", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), 0)
        power = probe.get("power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 0.0)
        temp = probe.get("temperature", lambda: float(
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)), 0.0)
        # NVML reports PCIe throughput in KB/s
        rx = probe.get("pcie rx", lambda: int(
            pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)) * 1024, 0)
        tx = probe.get("pcie tx", lambda: int(
            pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)) * 1024, 0)
        return DeviceMetrics(uuid=uuid, utilization_percent=util, memory_used_bytes=used, power_watts=power,
                             temperature_celsius=temp, pcie_rx_bytes=rx, pcie_tx_bytes=tx)

    # --- processes ---------------------------------------------------------------------------------

    async def list_processes(self) -> list[GpuProcess]:
        try:
            return await self._run(self._processes_sync)
        except pynvml.NVMLError as exc:
            raise DeviceBackendError(f"NVML process listing failed: {exc}") from exc

    def _processes_sync(self) -> list[GpuProcess]:
        result: list[GpuProcess] = []
        for position in range(pynvml.nvmlDeviceGetCount()):
            try:
                result.extend(self._device_processes(pynvml.nvmlDeviceGetHandleByIndex(position)))
            except pynvml.NVMLError as exc:
                log.debug("no processes for NVML device at position %d: %s", position, exc)
        return result

    @staticmethod
    def _device_processes(handle: Any) -> list[GpuProcess]:
        uuid = wire_uuid(_text(pynvml.nvmlDeviceGetUUID(handle)))
        probe = _DeviceProbe()
        empty_procs: list[Any] = []
        no_util: dict[int, float] = {}
        procs = probe.get("processes", lambda: _running_processes(handle), empty_procs)
        sm_util = probe.get("process utilization", lambda: {
            int(s.pid): float(s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, 0)}, no_util)
        return [GpuProcess(pid=int(proc.pid), device_uuid=uuid, used_memory_bytes=int(proc.usedGpuMemory or 0),
                           compute_percent=sm_util.get(int(proc.pid), 0.0)) for proc in procs]

    # --- partitions (MIG) -------------------------------------------------------------------------

    def _mig(self, gpu_uuid: str) -> _Mig:
        wanted = gpu_uuid.lower()
        for position in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(position)
            if wire_uuid(_text(pynvml.nvmlDeviceGetUUID(handle))) == wanted:
                return _Mig(handle, wanted)
        raise PartitionError(f"no NVIDIA GPU {gpu_uuid} on this node")

    async def _mig_call(self, what: str, gpu_uuid: str, call: Callable[[_Mig], T]) -> T:
        def run() -> T:
            return call(self._mig(gpu_uuid))

        try:
            return await self._run(run)
        except pynvml.NVMLError as exc:
            raise PartitionError(f"GPU {gpu_uuid}: {what} failed: NVML says {exc}") from exc

    async def create_partition(self, gpu_uuid: str, profile: PartitionProfile, slot_start: int | None) -> Partition:
        where = f" at slot {slot_start}" if slot_start is not None else ""
        return await self._mig_call(f"creating MIG {profile.describe()}{where}", gpu_uuid,
                                    lambda mig: mig.create(profile, slot_start))

    async def remove_partition(self, gpu_uuid: str, partition_uuid: str) -> None:
        await self._mig_call(f"removing MIG device {partition_uuid}", gpu_uuid, lambda mig: mig.remove(partition_uuid))

    async def list_partitions(self, gpu_uuid: str) -> list[Partition]:
        return await self._mig_call("listing MIG devices", gpu_uuid, lambda mig: mig.list())

    # --- XID events --------------------------------------------------------------------------------

    async def watch_health(self, changed: HealthChanged) -> None:
        try:
            event_set = await self._run(self._register_xid_events)
        except pynvml.NVMLError as exc:
            log.info("NVML XID events unavailable (%s); health comes from NVML errors only", exc)
            return
        if event_set is None:
            return
        try:
            while True:
                try:
                    event = await self._run(self._wait_event, event_set)
                except pynvml.NVMLError as exc:  # the driver is in trouble; discovery will say more
                    log.warning("waiting for NVML events failed: %s", exc)
                    await anyio.sleep(1.0)
                    continue
                if event is not None and self._record_xid(*event):
                    await changed()
                await anyio.sleep(0.05)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._run(pynvml.nvmlEventSetFree, event_set)
                except pynvml.NVMLError:
                    pass

    def _register_xid_events(self) -> Any:
        event_set = pynvml.nvmlEventSetCreate()
        registered = 0
        for position in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(position)
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except pynvml.NVMLError as exc:
                if exc.value not in _UNAVAILABLE_CODES:
                    raise
        if not registered:
            pynvml.nvmlEventSetFree(event_set)
            log.info("no device supports NVML XID events; health comes from NVML errors only")
            return None
        return event_set

    def _wait_event(self, event_set: Any) -> tuple[str, int] | None:
        try:
            data = pynvml.nvmlEventSetWait(event_set, _XID_WAIT_MS)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        return wire_uuid(_text(pynvml.nvmlDeviceGetUUID(data.device))), int(data.eventData)

    def _record_xid(self, uuid: str, xid: int) -> bool:
        if xid in _APPLICATION_XIDS:
            log.info("XID %d on %s (application error; device stays healthy)", xid, uuid)
            return False
        log.warning("XID %d on %s: marking the device unhealthy", xid, uuid)
        self._xid_problems[uuid] = f"XID {xid}"
        return True


def _profile_name(info: Any) -> str:
    """`MIG 1g.10gb` (the v2 profile info's name) as `1g.10gb`."""
    name = _text(info.name).strip()
    return name[4:] if name.upper().startswith("MIG ") else name


def _gi_profiles(handle: Any) -> list[Any]:
    """Every GPU-instance profile the GPU offers (v2 infos: id, slices, memory, name)."""
    found = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            found.append(pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index))
        except pynvml.NVMLError as exc:
            if exc.value not in _UNAVAILABLE_CODES:
                raise
    return found


def _placements(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of every placement NVML allows for the profile."""
    room = 16
    array = (pynvml.c_nvmlGpuInstancePlacement_t * room)()
    count = ctypes.c_uint(room)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]


def _mig_handles(handle: Any) -> list[Any]:
    handles = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_NOT_FOUND:
                raise
    return handles


class _Mig:
    """The MIG calls of one GPU, run in the backend's NVML thread."""

    def __init__(self, handle: Any, gpu: str) -> None:
        self.handle = handle
        self.gpu = gpu

    def require_mig_mode(self) -> None:
        current, pending = pynvml.nvmlDeviceGetMigMode(self.handle)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            after = " (pending: on after the next GPU reset)" if pending == pynvml.NVML_DEVICE_MIG_ENABLE else ""
            raise PartitionError(f"GPU {self.gpu}: MIG mode is off{after}; turn it on first "
                                 "(nvidia-smi -i <index> -mig 1, then reset the GPU)")

    def profile(self, wanted: PartitionProfile) -> Any:
        offered = _gi_profiles(self.handle)
        match = next((p for p in offered if wanted.nvml_profile_id is not None
                      and int(p.id) == wanted.nvml_profile_id), None) or next(
            (p for p in offered if canonical(_profile_name(p)) == canonical(wanted.name)), None)
        if match is None:
            names = ", ".join(f"{_profile_name(p)} (id {int(p.id)})" for p in offered) or "none"
            raise PartitionError(f"GPU {self.gpu} has no MIG profile {wanted.describe()}; it offers: {names}")
        return match

    def create(self, wanted: PartitionProfile, slot_start: int | None) -> Partition:
        self.require_mig_mode()
        info = self.profile(wanted)
        if slot_start is None:
            gpu_instance = pynvml.nvmlDeviceCreateGpuInstance(self.handle, info.id)
        else:
            allowed = _placements(self.handle, int(info.id))
            size = next((sz for start, sz in allowed if start == slot_start), None)
            if size is None:
                raise PartitionError(f"GPU {self.gpu}: profile {_profile_name(info)} cannot start at slot "
                                     f"{slot_start}; allowed start slots: {', '.join(str(a) for a, _ in allowed)}")
            placement = pynvml.c_nvmlGpuInstancePlacement_t(slot_start, size)
            gpu_instance = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                self.handle, info.id, ctypes.byref(placement))
        try:
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance, _FULL_CI_PROFILE[int(info.sliceCount)],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            compute = pynvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
        except (pynvml.NVMLError, KeyError):
            pynvml.nvmlGpuInstanceDestroy(gpu_instance)  # leave no GPU instance without its compute instance
            raise
        gi = pynvml.nvmlGpuInstanceGetInfo(gpu_instance)
        ci_id = int(pynvml.nvmlComputeInstanceGetInfo(compute).id)
        for mig in _mig_handles(self.handle):
            if (pynvml.nvmlDeviceGetGpuInstanceId(mig), pynvml.nvmlDeviceGetComputeInstanceId(mig)) == (gi.id, ci_id):
                return self._partition(mig, gi, info)
        pynvml.nvmlComputeInstanceDestroy(compute)
        pynvml.nvmlGpuInstanceDestroy(gpu_instance)
        raise PartitionError(f"GPU {self.gpu}: the driver created GPU instance {gi.id} but shows no MIG device for it")

    def _partition(self, mig: Any, gi: Any, info: Any) -> Partition:
        start = int(gi.placement.start)
        return Partition(uuid=_text(pynvml.nvmlDeviceGetUUID(mig)), parent_uuid=self.gpu,
                         profile_name=_profile_name(info), profile_id=int(info.id), slot_start=start,
                         slot_end=start + int(gi.placement.size), memory_bytes=int(info.memorySizeMB) * _MIB,
                         gpu_instance_id=int(gi.id),
                         compute_instance_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)))

    def list(self) -> list[Partition]:
        current, _ = pynvml.nvmlDeviceGetMigMode(self.handle)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        by_id = {int(p.id): p for p in _gi_profiles(self.handle)}
        found = []
        for mig in _mig_handles(self.handle):
            gi = pynvml.nvmlGpuInstanceGetInfo(
                pynvml.nvmlDeviceGetGpuInstanceById(self.handle, pynvml.nvmlDeviceGetGpuInstanceId(mig)))
            info = by_id.get(int(gi.profileId))
            if info is not None:
                found.append(self._partition(mig, gi, info))
        return sorted(found, key=lambda p: p.slot_start)

    def remove(self, partition_uuid: str) -> None:
        current, _ = pynvml.nvmlDeviceGetMigMode(self.handle)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        for mig in _mig_handles(self.handle):
            if _text(pynvml.nvmlDeviceGetUUID(mig)) != partition_uuid:
                continue
            gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(self.handle, pynvml.nvmlDeviceGetGpuInstanceId(mig))
            compute = pynvml.nvmlGpuInstanceGetComputeInstanceById(
                gpu_instance, pynvml.nvmlDeviceGetComputeInstanceId(mig))
            pynvml.nvmlComputeInstanceDestroy(compute)
            pynvml.nvmlGpuInstanceDestroy(gpu_instance)
            return


def _running_processes(handle: Any) -> list[Any]:
    try:
        return list(pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle))
    except pynvml.NVMLError_FunctionNotFound:
        return list(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle))
