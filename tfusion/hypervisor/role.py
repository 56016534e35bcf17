"""`tfusion --role=hypervisor`: the node agent.

Start order: open the device backend (--devices), run the first discovery, start the worker
backend (local state dir, or Kubernetes: GPU objects and the worker-pod informer), then serve the
HTTP API on --port. /readyz lists a condition per loop: discovery, and in Kubernetes mode the
GPUNode's existence and the pod informer's sync.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from tfusion.errors import RoleError
from tfusion.hypervisor.devices import DeviceBackendError, open_backend
from tfusion.hypervisor.devices.gpu_info import GpuInfoTable, HardwareMetadataError
from tfusion.hypervisor.devices.registry import DeviceChanges, DeviceRegistry
from tfusion.hypervisor.http import HypervisorContext, build_app
from tfusion.hypervisor.metrics import MetricsFileWriter, new_metrics_registry, parse_extra_labels
from tfusion.settings import Settings, process_environment
from tfusion.web import Readiness, bind_socket, serve

log = logging.getLogger(__name__)

#: how often device metrics and processes are sampled for /metrics and the workers API
SAMPLE_INTERVAL_S = 5.0


class HypervisorError(RoleError):
    """The hypervisor cannot start; the message says what to fix (the CLI prints it and exits 1)."""


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    node = settings.resolved_node_name
    try:
        table = GpuInfoTable.from_metadata(settings.hardware_metadata)
    except HardwareMetadataError as exc:
        raise HypervisorError(str(exc)) from None
    try:
        extra_labels = parse_extra_labels(settings.metrics_extra_labels)
    except ValueError as exc:
        raise HypervisorError(str(exc)) from None
    readiness = Readiness()
    readiness.set("discovery", False, "first device discovery has not finished")
    try:
        backend = await open_backend(settings.devices, node_name=node, table=table,
                                     sim_load_file=settings.resolved_state_dir / "sim-load.json")
    except DeviceBackendError as exc:
        raise HypervisorError(str(exc)) from None
    registry = DeviceRegistry(backend, table)
    _track_discovery(registry, readiness)
    try:
        try:
            sock = bind_socket(f":{settings.hypervisor_port}")
        except OSError as exc:
            raise HypervisorError(f"--port: {exc}") from None
        port = sock.getsockname()[1]
        async with anyio.create_task_group() as tg:
            workers, extra = await _start_workers(settings, registry, readiness, tg, node, port)
            try:
                await registry.discover()
            except DeviceBackendError as exc:
                readiness.set("discovery", False, f"device discovery failed: {exc}")
            await registry.sample()
            if settings.backend == "local":
                await tg.start(workers.run)
            prom = new_metrics_registry(registry, workers, node, settings.pool_name)
            ctx = HypervisorContext(settings=settings, registry=registry, workers=workers, readiness=readiness,
                                    metrics_registry=prom, reviewer=extra.get("reviewer"))
            app = build_app(ctx)
            tg.start_soon(registry.run_discovery_loop, settings.discovery_interval)
            tg.start_soon(registry.run_health_watch)
            tg.start_soon(_sample_loop, registry, min(SAMPLE_INTERVAL_S, settings.metrics_interval))
            writer = MetricsFileWriter(_metrics_path(settings), registry, workers, node=node,
                                       pool=settings.pool_name, fmt=settings.metrics_format,
                                       extra_labels=extra_labels)
            tg.start_soon(writer.run, settings.metrics_interval)
            await tg.start(serve, app, sock)
            log.info("hypervisor for node %s serving on port %d (%s devices, %s backend)", node, port,
                     backend.name, settings.backend)
            task_status.started(port)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.close()


def _metrics_path(settings: Settings) -> Path:
    return Path(settings.metrics_output_path).expanduser()


def _track_discovery(registry: DeviceRegistry, readiness: Readiness) -> None:
    async def on_changes(changes: DeviceChanges) -> None:
        backend = registry.backend
        if backend.unavailable_reason:
            readiness.set("discovery", True, backend.unavailable_reason)
        else:
            unhealthy = [d.uuid for d in changes.current if not d.healthy]
            message = f"{len(changes.current)} device(s) from {backend.name}"
            if unhealthy:
                message += f"; unhealthy: {', '.join(unhealthy)}"
            readiness.set("discovery", True, message)

    registry.subscribe(on_changes)


async def _sample_loop(registry: DeviceRegistry, interval: float) -> None:
    while True:
        await anyio.sleep(interval)
        await registry.sample()


async def _start_workers(settings: Settings, registry: DeviceRegistry, readiness: Readiness, tg: Any,
                         node: str, port: int) -> tuple[Any, dict[str, Any]]:
    if settings.backend == "local":
        from tfusion.hypervisor.workers.local import LocalWorkers

        workers = LocalWorkers(settings.resolved_state_dir, registry, node_name=node,
                               pool=settings.pool_name if settings.pool_name != "unknown" else "local",
                               hypervisor_port=port, process_env=process_environment())
        return workers, {}
    if not settings.node_name and "all" not in settings.roles:
        raise HypervisorError("--backend=kubernetes needs the node name: set GPU_NODE_NAME or --node-name")
    from tfusion.hypervisor.workers.kubernetes import start_kubernetes_workers

    return await start_kubernetes_workers(settings, registry, readiness, tg, node)
