"""`tfusion --role=hypervisor`: the node agent.

Start order: open the device backend (--devices), run the first discovery, register the worker
backend with the process's Manager (local state dir, or Kubernetes: GPU reporting and the
worker pods, both from the shared cache), then serve the HTTP API on --port. /readyz lists a
condition per loop: discovery, and in Kubernetes mode the GPUNode's existence and the pod
informer's sync. Its /metrics serves the Manager's registry, shared with the other roles.

Soft isolation (`limiter/soft.py`) keeps each soft worker's shared-memory file under --shm-root
current every 500 ms (readiness `shm-sync`, `rate-limiter`); its rate-limit parameters come from
TF_HYPERVISOR_SCHEDULING_CONFIG over the node's pool's SchedulingConfigTemplate (`limiter/config.py`,
Kubernetes backend). With the Kubernetes backend and a kubelet device-plugin directory
(--device-plugin-dir), the 16 index device plugins serve and stay registered (`device-plugins`).
With DETECT_IN_USED_GPUS, GPUs another device plugin holds are marked (`external_plugins.py`).
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
from tfusion.hypervisor.limiter.config import SchedulingConfig, follow_template
from tfusion.hypervisor.limiter.soft import SoftIsolation
from tfusion.hypervisor.metrics import parse_extra_labels, start_usage_metrics
from tfusion.hypervisor.shm.store import ShmStore
from tfusion.kube.manager import Manager
from tfusion.settings import Settings, format_listen, is_loopback, process_environment
from tfusion.web import Readiness, bind_socket, serve

log = logging.getLogger(__name__)

#: how often device metrics and processes are sampled for /metrics and the workers API
SAMPLE_INTERVAL_S = 5.0


class HypervisorError(RoleError):
    """The hypervisor cannot start; the message says what to fix (the CLI prints it and exits 1)."""


async def _own_manager(settings: Settings) -> Manager:
    """A Manager for a hypervisor run on its own (tests, or `run` called directly)."""
    if settings.backend == "local":
        return Manager(settings, None)
    try:
        return await Manager.connect(settings)
    except ValueError as exc:
        raise HypervisorError(f"hypervisor: {exc}") from None


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
              manager: Manager | None = None) -> None:
    node = settings.resolved_node_name
    try:
        table = GpuInfoTable.from_metadata(settings.hardware_metadata)
    except HardwareMetadataError as exc:
        raise HypervisorError(str(exc)) from None
    try:
        extra_labels = parse_extra_labels(settings.metrics_extra_labels)
    except ValueError as exc:
        raise HypervisorError(str(exc)) from None
    try:
        scheduling = SchedulingConfig(settings.scheduling_config)
    except ValueError as exc:
        raise HypervisorError(str(exc)) from None
    if settings.detect_in_used_gpus and settings.backend != "kubernetes":
        raise HypervisorError("DETECT_IN_USED_GPUS=true marks GPU objects, which only --backend=kubernetes has")
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
        api_token = _local_api_token(settings)
        try:
            sock = bind_socket(settings.resolved_hypervisor_listen)
        except OSError as exc:
            raise HypervisorError(f"--host/--port: {exc}") from None
        port = sock.getsockname()[1]
        owns_manager = manager is None
        if manager is None:
            manager = await _own_manager(settings)
        async with anyio.create_task_group() as tg:
            workers, extra = _start_workers(settings, manager, registry, readiness, node)
            try:
                await registry.discover()
            except DeviceBackendError as exc:
                readiness.set("discovery", False, f"device discovery failed: {exc}")
            await registry.sample()
            soft = SoftIsolation(ShmStore(settings.resolved_shm_root), registry, workers,
                                 params=scheduling.erl_params(),
                                 readiness=readiness, synced=_workers_synced(workers))
            if settings.backend == "local":
                workers.prepare_soft = soft.ensure_for
                await tg.start(workers.run)
            usage = start_usage_metrics(settings, manager, registry, workers, node, extra_labels, soft)
            ctx = HypervisorContext(settings=settings, registry=registry, workers=workers, readiness=readiness,
                                    metrics_registry=manager.registry, reviewer=extra.get("reviewer"),
                                    api_token=api_token, soft=soft, scheduling=scheduling,
                                    partitioner=extra.get("partitioner"))
            app = build_app(ctx)
            tg.start_soon(registry.run_discovery_loop, settings.discovery_interval)
            tg.start_soon(registry.run_health_watch)
            await soft.tick()  # files of soft workers restored above exist before the API answers
            tg.start_soon(soft.run)
            if settings.backend == "kubernetes" and manager.has_client:
                def new_params() -> None:
                    soft.params = scheduling.erl_params()

                tg.start_soon(follow_template, scheduling, manager.client, node, new_params)
            plugin_dir = settings.resolved_device_plugin_dir
            if settings.detect_in_used_gpus:
                from tfusion.hypervisor.external_plugins import attach_detector

                attach_detector(manager, node=node, device_plugin_dir=plugin_dir)
            if plugin_dir is not None and settings.backend == "kubernetes":
                from tfusion.hypervisor.deviceplugin.plugins import DevicePlugins
                from tfusion.hypervisor.workers import dynamic_policy

                admit = dynamic_policy.checker(workers.allocations) \
                    if settings.resolved_hypervisor_isolation_policy == "dynamic" else None
                tg.start_soon(DevicePlugins(plugin_dir, workers, registry, readiness=readiness,
                                            partitioner=extra.get("partitioner"), admit=admit).run)
            if extra.get("partitioner") is not None:
                tg.start_soon(extra["partitioner"].run)
            tg.start_soon(_sample_loop, registry, min(SAMPLE_INTERVAL_S, settings.metrics_interval))
            tg.start_soon(usage.run, settings.metrics_interval)
            await tg.start(serve, app, sock)
            log.info("hypervisor for node %s serving on %s (%s devices, %s backend)", node,
                     format_listen(settings.resolved_hypervisor_host, port), backend.name, settings.backend)
            if owns_manager:
                await tg.start(manager.run)
            task_status.started(port)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.close()


def _local_api_token(settings: Settings) -> str | None:
    """The local backend's worker routes run commands: beyond loopback they need a bearer token.
    None when no --api-token-file is given (allowed only on loopback, or with Kubernetes)."""
    if not settings.api_token_file:
        host = settings.resolved_hypervisor_host
        if settings.backend == "local" and not is_loopback(host):
            raise HypervisorError(f"--api-token-file is required with --backend=local when the hypervisor listens "
                                  f"beyond loopback (--host={host}): POST /api/v1/workers runs commands")
        return None
    path = Path(settings.api_token_file).expanduser()
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise HypervisorError(f"--api-token-file={path}: cannot read it: {exc}") from None
    if not token:
        raise HypervisorError(f"--api-token-file={path}: the file is empty; put the bearer token in it")
    return token


def _workers_synced(workers: Any) -> Any:
    """When the tracker knows every worker (before that, every shm file would look like a stray)."""
    informer = getattr(workers, "informer", None)
    if informer is not None:
        return lambda: bool(informer.synced)
    return lambda: bool(getattr(workers, "restored", True))


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


def _start_workers(settings: Settings, manager: Manager, registry: DeviceRegistry, readiness: Readiness,
                   node: str) -> tuple[Any, dict[str, Any]]:
    if settings.backend == "local":
        from tfusion.hypervisor.workers.local import LocalWorkers

        workers = LocalWorkers(settings.resolved_state_dir, registry, node_name=node,
                               pool=settings.pool_name if settings.pool_name != "unknown" else "local",
                               process_env=process_environment(),
                               shm_root=settings.resolved_shm_root, limiter_library=settings.limiter_library)
        return workers, {}
    if not settings.node_name and "all" not in settings.roles:
        raise HypervisorError("--backend=kubernetes needs the node name: set GPU_NODE_NAME or --node-name")
    from tfusion.hypervisor.workers.kubernetes import register_kubernetes_workers

    return register_kubernetes_workers(settings, manager, registry, readiness, node)
