"""The hypervisor's view of its devices: discovery passes, diffs, TFLOPS and the latest samples.

The backend reports raw facts; the registry fills in fp16 TFLOPS from the gpu-info table, keeps the
current set keyed by lowercase UUID, tells subscribers what was added, changed or removed, and
holds the last metrics and process samples for the HTTP API and the metrics writers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from tfusion.hypervisor.devices.backend import DeviceBackend, DeviceBackendError
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable
from tfusion.hypervisor.devices.model import DeviceInfo, DeviceMetrics, GpuProcess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceChanges:
    """The outcome of one discovery pass."""

    added: tuple[DeviceInfo, ...] = ()
    updated: tuple[DeviceInfo, ...] = ()
    removed: tuple[DeviceInfo, ...] = ()
    current: tuple[DeviceInfo, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)


DeviceListener = Callable[[DeviceChanges], Awaitable[None]]


class DeviceRegistry:
    """Current devices and samples; `discover()` and `sample()` refresh them from the backend."""

    def __init__(self, backend: DeviceBackend, table: GpuInfoTable | None = None) -> None:
        self.backend = backend
        self.table = table or GpuInfoTable()
        self._devices: dict[str, DeviceInfo] = {}
        self._metrics: dict[str, DeviceMetrics] = {}
        self._processes: list[GpuProcess] = []
        self._listeners: list[DeviceListener] = []
        self._lock = anyio.Lock()
        self.discovered = False
        self.last_discovery: float = 0.0
        self.last_error = ""

    # --- reads -------------------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return sorted(self._devices.values(), key=lambda d: (d.index, d.uuid))

    def get(self, uuid: str) -> DeviceInfo | None:
        return self._devices.get(uuid.lower())

    def metrics(self) -> dict[str, DeviceMetrics]:
        return dict(self._metrics)

    def processes(self) -> list[GpuProcess]:
        return list(self._processes)

    def subscribe(self, listener: DeviceListener) -> None:
        self._listeners.append(listener)

    # --- refresh -----------------------------------------------------------------------------------

    def _enrich(self, device: DeviceInfo) -> DeviceInfo:
        if device.max_tflops > 0:
            return device
        return device.replace(max_tflops=self.table.fp16_tflops(device.model))

    async def discover(self) -> DeviceChanges:
        """One discovery pass; raises DeviceBackendError (and records it) when the backend fails."""
        async with self._lock:
            try:
                found = [self._enrich(d) for d in await self.backend.discover()]
            except DeviceBackendError as exc:
                self.last_error = str(exc)
                log.error("device discovery failed: %s", exc)
                raise
            self.last_error = ""
            new = {d.uuid: d for d in found}
            old = self._devices
            changes = DeviceChanges(
                added=tuple(d for u, d in new.items() if u not in old),
                updated=tuple(d for u, d in new.items() if u in old and old[u] != d),
                removed=tuple(d for u, d in old.items() if u not in new),
                current=tuple(sorted(new.values(), key=lambda d: (d.index, d.uuid))))
            self._devices = new
            first = not self.discovered
            self.discovered = True
            self.last_discovery = time.time()
            self._metrics = {u: m for u, m in self._metrics.items() if u in new}
        if changes.changed or first:
            log.info("discovered %d device(s) with %s: %d added, %d changed, %d removed", len(new),
                     self.backend.name, len(changes.added), len(changes.updated), len(changes.removed))
        for listener in list(self._listeners):
            await listener(changes)
        return changes

    async def sample(self) -> None:
        """Refresh metrics and processes; a failing backend keeps the previous sample."""
        try:
            metrics = await self.backend.read_metrics()
            processes = await self.backend.list_processes()
        except DeviceBackendError as exc:
            log.warning("device sampling failed: %s", exc)
            return
        self._metrics = {m.uuid: m for m in metrics}
        self._processes = processes

    async def run_discovery_loop(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await self.discover()
            except DeviceBackendError:
                pass

    async def run_health_watch(self) -> None:
        async def changed() -> None:
            try:
                await self.discover()
            except DeviceBackendError:
                pass

        await self.backend.watch_health(changed)
