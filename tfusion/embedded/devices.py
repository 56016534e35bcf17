"""Which devices this machine offers, decided once before the roles start.

`--devices=auto` means NVML where a driver answers. On a machine without one, `--role=all` (or
`--sim-devices-fallback=sim:SPEC`) falls back to simulated GPUs, so a newcomer's first run has
GPUs to schedule; the fallback is logged loudly. The result is handed to the hypervisor as its
`--devices` value and to the simulated kubelet, which labels the Node from it (as NVIDIA's GPU
feature discovery would).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tfusion.hypervisor.devices import DeviceBackendError, open_backend
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable, HardwareMetadataError
from tfusion.hypervisor.devices.model import DeviceInfo
from tfusion.settings import Settings

log = logging.getLogger(__name__)


class DevicePlanError(RuntimeError):
    """The devices cannot be opened as configured; the message says which flag and why."""


@dataclass(frozen=True)
class DevicePlan:
    """The `--devices` value the hypervisor will use, what it finds, and why."""

    spec: str
    devices: tuple[DeviceInfo, ...]
    backend: str  # "nvml", "sim" or "none"
    note: str = ""  # why these devices (set when simulated by fallback, or when there are none)

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def simulated(self) -> bool:
        return self.backend == "sim"

    def describe(self) -> str:
        if not self.devices:
            return f"no GPUs ({self.note})" if self.note else "no GPUs"
        models: dict[str, int] = {}
        for device in self.devices:
            models[device.model] = models.get(device.model, 0) + 1
        text = ", ".join(f"{n}x {model}" for model, n in models.items())
        kind = "simulated" if self.simulated else self.backend
        return f"{self.count} GPU(s), {kind}: {text}"


async def plan_devices(settings: Settings) -> DevicePlan:
    """Open the configured backend once, count its devices, and apply the simulated fallback when
    `--devices=auto` found no driver. Raises DevicePlanError for an unusable configuration."""
    try:
        table = GpuInfoTable.from_metadata(settings.hardware_metadata)
    except HardwareMetadataError as exc:
        raise DevicePlanError(str(exc)) from None
    node = settings.resolved_node_name
    spec = settings.devices.strip()
    devices, backend_name, reason = await _probe(spec, node, table)
    fallback = settings.resolved_sim_devices_fallback
    if backend_name == "none" and spec == "auto" and fallback:
        log.warning("=" * 78)
        log.warning("SIMULATED GPUs: --devices=auto found no NVIDIA driver, so this node gets --devices=%s", fallback)
        log.warning("(--sim-devices-fallback; --sim-devices-fallback=off or --devices=nvml to refuse)")
        log.warning("=" * 78)
        devices, backend_name, _ = await _probe(fallback, node, table)
        return DevicePlan(fallback, devices, backend_name, f"no NVIDIA driver answered; simulated {fallback}")
    return DevicePlan(spec, devices, backend_name, reason)


async def _probe(spec: str, node: str, table: GpuInfoTable) -> tuple[tuple[DeviceInfo, ...], str, str]:
    try:
        backend = await open_backend(spec, node_name=node, table=table)
    except DeviceBackendError as exc:
        raise DevicePlanError(str(exc)) from None
    try:
        return tuple(await backend.discover()), backend.name, backend.unavailable_reason
    except DeviceBackendError as exc:
        raise DevicePlanError(f"--devices={spec}: device discovery failed: {exc}") from None
    finally:
        await backend.close()
