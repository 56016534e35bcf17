"""`DeviceBackend`: the one seam between the hypervisor and accelerator hardware.

Implementations: `nvml.NvmlBackend` (nvidia-ml-py), `sim.SimBackend` (devices from a spec, with
scriptable load) and `NoDevicesBackend` (no driver answered). Backends report raw facts; the
registry fills in TFLOPS from the gpu-info table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio

from tfusion.hypervisor.devices.model import DeviceInfo, DeviceMetrics, GpuProcess

if TYPE_CHECKING:
    from tfusion.hypervisor.devices.partitions import Partition, PartitionProfile

#: called by a backend's health watch when a device's health changed
HealthChanged = Callable[[], Awaitable[None]]


class DeviceBackendError(RuntimeError):
    """The backend cannot do what was asked (driver gone, bad spec); the message says why."""


@runtime_checkable
class DeviceBackend(Protocol):
    """Discovery, metrics and processes for one node's accelerators."""

    #: short name for logs and /readyz ("nvml", "sim", "none")
    name: str
    #: why the node has no devices, for /readyz and the log ("" when the backend has a driver)
    unavailable_reason: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def discover(self) -> list[DeviceInfo]:
        """Every device now present, with health."""
        ...

    async def read_metrics(self) -> list[DeviceMetrics]:
        """One load sample per present device."""
        ...

    async def list_processes(self) -> list[GpuProcess]:
        """Processes holding device memory, by host PID."""
        ...

    async def watch_health(self, changed: HealthChanged) -> None:
        """Run until cancelled, calling `changed` when a device turns unhealthy (e.g. an XID error).
        Returns at once when the backend has no event source."""
        ...

    async def create_partition(self, gpu_uuid: str, profile: PartitionProfile, slot_start: int | None) -> Partition:
        """A new hardware partition (MIG GPU instance + compute instance) of `profile` on the GPU, at
        `slot_start` when given, else where the driver places it. Raises PartitionError saying why not."""
        ...

    async def remove_partition(self, gpu_uuid: str, partition_uuid: str) -> None:
        """Destroy a partition; one that is not there is already removed (no error)."""
        ...

    async def list_partitions(self, gpu_uuid: str) -> list[Partition]:
        """The GPU's partitions now present."""
        ...


class NoDevicesBackend:
    """The node has no usable driver: no devices, and a reason that /readyz and the log show."""

    name = "none"

    def __init__(self, reason: str) -> None:
        self.unavailable_reason = reason

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def discover(self) -> list[DeviceInfo]:
        return []

    async def read_metrics(self) -> list[DeviceMetrics]:
        return []

    async def list_processes(self) -> list[GpuProcess]:
        return []

    async def watch_health(self, changed: HealthChanged) -> None:
        await anyio.lowlevel.checkpoint()

    async def create_partition(self, gpu_uuid: str, profile: PartitionProfile, slot_start: int | None) -> Partition:
        from tfusion.hypervisor.devices.partitions import PartitionError

        raise PartitionError(f"cannot create a {profile.name} partition on GPU {gpu_uuid}: {self.unavailable_reason}")

    async def remove_partition(self, gpu_uuid: str, partition_uuid: str) -> None:
        await anyio.lowlevel.checkpoint()

    async def list_partitions(self, gpu_uuid: str) -> list[Partition]:
        return []
