"""The device layer: `DeviceBackend` implementations and `open_backend`, which picks one from
`--devices` (auto, nvml, or sim:SPEC)."""

from __future__ import annotations

import logging
from pathlib import Path

from tfusion.hypervisor.devices.backend import DeviceBackend, DeviceBackendError, NoDevicesBackend
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable

log = logging.getLogger(__name__)

__all__ = ["DeviceBackend", "DeviceBackendError", "NoDevicesBackend", "open_backend"]


async def open_backend(devices: str, *, node_name: str, table: GpuInfoTable,
                       sim_load_file: Path | None = None) -> DeviceBackend:
    """An opened backend for the `--devices` value. `auto` falls back to no devices (and says why)
    when no NVIDIA driver answers; `nvml` makes that an error."""
    spec = devices.strip()
    if spec.startswith("sim:"):
        from tfusion.hypervisor.devices.sim import SimBackend

        sim = SimBackend(spec, node_name, load_file=sim_load_file, table=table)
        await sim.open()
        return sim
    if spec not in ("auto", "nvml"):
        raise DeviceBackendError(f"--devices={devices!r}: expected auto, nvml, or sim:<count>x<model>[,...]")
    from tfusion.hypervisor.devices.nvml import NvmlBackend

    nvml = NvmlBackend()
    try:
        await nvml.open()
    except DeviceBackendError as exc:
        if spec == "nvml":
            raise
        reason = f"no NVIDIA driver answered ({exc}); running with no devices"
        log.warning("--devices=auto: %s", reason)
        return NoDevicesBackend(reason)
    return nvml
