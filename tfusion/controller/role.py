"""The controller role: registers the controller's work on the process's Manager and serves its HTTP API.

Every replica reads the shared informers (the 12 tensor-fusion.ai kinds, nodes, and our own
pods), watches the dynamic config and serves `/healthz`, `/readyz`, `/metrics` and `/api/*`. The
leader-only work (allocator feed and status reconcilers, sweeps, …) is registered with the
Manager, which starts it once the caches have synced and this replica leads, cancels it when it
stops leading, and starts it again when it leads again. Services are attached in `configure()`
through `ControllerRuntime`. Cancellation (SIGTERM in roles.py) closes the server; the Manager
releases the Lease.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from tfusion.controller.dynamic_config import DynamicConfig
from tfusion.controller.http import config_handlers
from tfusion.errors import RoleError
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient
from tfusion.kube.events import EventRecorder
from tfusion.kube.informer import Informer, node_name_index
from tfusion.kube.manager import Manager
from tfusion.settings import Settings
from tfusion.web import Readiness, bind_socket, health_handlers, make_app, metrics_handler, serve

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.reconcilers import Reconcilers
    from tfusion.controller.scheduling.assignments import Assignments
    from tfusion.controller.scheduling.scheduler import Scheduler
    from tfusion.controller.webhook.service import WebhookService
    from tfusion.metrics.controller import ControllerRecorder

log = logging.getLogger(__name__)

Task = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class ControllerRuntime:
    """What the controller's services share: the process's Manager (client, cache, registry,
    events, leadership) plus the role's own routes and readiness. Add to it in `configure()`."""

    settings: Settings
    manager: Manager
    readiness: Readiness
    dynamic_config: DynamicConfig
    #: the informers the controller reads, resolved once from the shared cache (pods: ours only)
    informers: dict[r.ApiResource, Informer]
    #: Litestar handlers served on --controller-listen
    routes: list[Any] = field(default_factory=list)
    #: leader-only runnables added through `add_leader_task` (also registered with the Manager)
    leader_tasks: list[Task] = field(default_factory=list)
    #: run on every replica for the life of the process
    tasks: list[Task] = field(default_factory=list)
    #: (host, port) the HTTP server is bound to, once serving
    address: tuple[str, int] | None = None
    #: (host, port) of the probe server (--health-probe-bind-address), once serving
    probe_address: tuple[str, int] | None = None
    #: True when this runtime made its Manager and so must run it (a controller-only process)
    owns_manager: bool = False
    #: the services configure() attached, for the others to find (None until attached)
    allocation: AllocatorService | None = None
    #: the pod webhook (None until attached, or when ENABLE_WEBHOOKS=false); `.address` is its bound port
    webhook: WebhookService | None = None
    reconcilers: Reconcilers | None = None
    assignments: Assignments | None = None
    #: the scheduler (None until attached, or when ENABLE_SCHEDULER=false)
    scheduler: Scheduler | None = None
    #: the metrics recorder (tfusion/metrics/controller.py; None until attached)
    metrics: ControllerRecorder | None = None
    #: informers a service reads besides `informers` (other selectors on one of their resources,
    #: such as the scheduler's on every pod), by their /readyz condition
    other_informers: dict[str, Informer] = field(default_factory=dict)

    @property
    def client(self) -> KubeClient:
        return self.manager.client

    @client.setter
    def client(self, client: KubeClient) -> None:
        self.manager.client = client

    @property
    def registry(self) -> CollectorRegistry:
        return self.manager.registry

    @property
    def events(self) -> EventRecorder:
        return self.manager.recorder

    @property
    def identity(self) -> str:
        return self.manager.identity

    @property
    def is_leader(self) -> bool:
        return self.manager.is_leader

    def informer(self, resource: r.ApiResource) -> Informer:
        return self.informers[resource]

    def track_readiness(self, informer: Informer, condition: str) -> None:
        """/readyz waits for `informer` too, under `condition` (for one not in `informers`)."""
        self.other_informers[condition] = informer

    def add_leader_task(self, task: Task) -> None:
        self.leader_tasks.append(task)
        self.manager.add(task, leader_only=True, name=getattr(task, "__qualname__", repr(task)))


def component_selector(settings: Settings) -> str:
    """Our pods carry `<domain>/component`; the controller's pod informer watches only those (the
    scheduler, which must count every pod on a node, has its own on every pod)."""
    return f"{settings.domain}/component"


async def build_runtime(settings: Settings, manager: Manager | None = None) -> ControllerRuntime:
    """The controller's runtime on `manager` (the process's; None: a Manager of its own, which
    `serve_runtime` then runs)."""
    owns = manager is None
    if manager is None:
        manager = await Manager.connect(settings)
    cache = manager.cache
    informers = {res: cache.informer(res) for res in (*r.TF_RESOURCES, r.NODES)}
    informers[r.PODS] = cache.informer(r.PODS, label_selector=component_selector(settings))
    informers[r.PODS].add_index("node", node_name_index)
    informers[r.GPUS].add_index("node", node_name_index)
    informers[r.GPUS].add_label_index(f"{settings.domain}/gpupool")
    dynamic_config = DynamicConfig(settings.dynamic_config, interval=settings.dynamic_config_interval)
    runtime = ControllerRuntime(settings=settings, manager=manager, readiness=Readiness(),
                                dynamic_config=dynamic_config, informers=informers, owns_manager=owns)
    runtime.routes.extend(config_handlers(runtime.dynamic_config))
    return runtime


def configure(runtime: ControllerRuntime) -> None:
    """Attach the controller's services, in this order: the allocator service (the others use
    it), the pod webhook with the index and port allocators, the reconcilers (not with
    ENABLE_CR_CONTROLLER=false), the scheduler. Each registers its informers, routes and runnables
    on the runtime and its Manager."""
    # imported here: each of these modules imports this one
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.connection_http import attach_connection_route
    from tfusion.controller.reconcilers import register_reconcilers
    from tfusion.controller.scheduling.scheduler import attach_scheduler
    from tfusion.controller.webhook.service import attach_webhook
    from tfusion.metrics.controller import attach_metrics

    AllocatorService(runtime).attach()
    attach_webhook(runtime)
    if runtime.settings.enable_cr_controller:
        register_reconcilers(runtime)
    attach_connection_route(runtime)
    attach_scheduler(runtime)
    attach_metrics(runtime)


def _bind(flag: str, listen: str) -> socket.socket:
    try:
        return bind_socket(listen)
    except OSError as exc:
        raise RoleError(f"controller: {flag}: {exc}") from None


def _condition(informer: Informer) -> str:
    # by resource, the condition's name since before pods were read with a selector
    return f"informer {informer.resource.name}"


async def _track_readiness(runtime: ControllerRuntime, condition: str, informer: Informer) -> None:
    await informer.wait_synced()
    runtime.readiness.set(condition, True, f"synced, {len(informer)} objects ({informer.name})")


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
              manager: Manager | None = None) -> None:
    runtime = await build_runtime(settings, manager)
    configure(runtime)
    await serve_runtime(runtime, task_status=task_status)


async def serve_runtime(runtime: ControllerRuntime, *,
                        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve the controller's HTTP API until cancelled; `task_status.started(runtime)` once
    serving. A runtime that owns its Manager runs it too (else roles.py runs the shared one)."""
    settings = runtime.settings
    sock = _bind("--controller-listen", settings.resolved_controller_listen)
    probe_sock = _bind("--health-probe-bind-address", settings.resolved_health_probe_listen)
    host, port = sock.getsockname()[:2]
    runtime.address = (host, port)
    runtime.probe_address = probe_sock.getsockname()[:2]
    async with anyio.create_task_group() as tg:
        await tg.start(runtime.dynamic_config.run)
        watched = {_condition(informer): informer for informer in runtime.informers.values()}
        for condition, informer in (watched | runtime.other_informers).items():
            runtime.readiness.set(condition, False, f"waiting for the initial list ({informer.name})")
            tg.start_soon(_track_readiness, runtime, condition, informer)
        for task in runtime.tasks:
            tg.start_soon(task)
        handlers = [*runtime.routes, *health_handlers(runtime.readiness), metrics_handler(runtime.registry)]
        app = make_app(handlers, title="tfusion controller")
        await tg.start(serve, app, sock)
        # the probes again on their own port, as the original's chart probes them (:8081)
        await tg.start(serve, make_app(health_handlers(runtime.readiness), title="tfusion controller probes"),
                       probe_sock)
        log.info("controller HTTP API listening on http://%s:%d (probes on port %d)", host, port,
                 runtime.probe_address[1])
        if runtime.owns_manager:
            await tg.start(runtime.manager.run)
        task_status.started(runtime)
