"""The controller role: wires the Kubernetes plumbing, leader election and the HTTP server together.

Every replica runs the shared informers (the 12 tensor-fusion.ai kinds, nodes, and our own pods),
the dynamic config watcher and the HTTP server (`/healthz`, `/readyz`, `/metrics`, `/api/*`).
Only the elected leader runs the leader-only tasks (reconcilers, allocator sync, …): they start
when this replica becomes leader and are cancelled when it stops leading. Services are attached
in `configure()` through `ControllerRuntime`: routes, leader-only tasks and tasks for every
replica. Cancellation (SIGTERM in roles.py) releases the Lease and closes the server within the
shutdown budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Gauge

from tfusion.controller.dynamic_config import DynamicConfig
from tfusion.controller.http import config_handlers
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound
from tfusion.kube.events import EventRecorder
from tfusion.kube.informer import Informer, InformerFactory, node_name_index
from tfusion.kube.leader import LeaderElector, default_identity
from tfusion.kube.workqueue import metrics_for
from tfusion.settings import Settings
from tfusion.web import Readiness, bind_socket, health_handlers, make_app, metrics_handler, serve

log = logging.getLogger(__name__)

Task = Callable[[], Coroutine[Any, Any, None]]

#: how long shutdown may spend releasing the Lease and closing connections (roles.py allows ~5 s)
RELEASE_TIMEOUT_S = 2.0


@dataclass
class ControllerRuntime:
    """What the controller's services share. Add to it in `configure()`, before serving starts."""

    settings: Settings
    client: KubeClient
    registry: CollectorRegistry
    factory: InformerFactory
    informers: dict[r.Resource, Informer]
    readiness: Readiness
    dynamic_config: DynamicConfig
    events: EventRecorder
    identity: str
    elector: LeaderElector | None = None
    #: Litestar handlers served on --controller-listen
    routes: list[Any] = field(default_factory=list)
    #: started on becoming leader, cancelled on losing it (every one of them, together)
    leader_tasks: list[Task] = field(default_factory=list)
    #: run on every replica for the life of the process
    tasks: list[Task] = field(default_factory=list)
    #: (host, port) the HTTP server is bound to, once serving
    address: tuple[str, int] | None = None
    _leading_without_election: bool = False

    @property
    def is_leader(self) -> bool:
        if self.elector is not None:
            return self.elector.is_leader
        return self._leading_without_election

    def informer(self, resource: r.Resource) -> Informer:
        return self.informers[resource]

    def add_leader_task(self, task: Task) -> None:
        self.leader_tasks.append(task)

    async def run_leader_tasks(self) -> None:
        async with anyio.create_task_group() as tg:
            for task in self.leader_tasks:
                tg.start_soon(task)


def component_selector(settings: Settings) -> str:
    """Our pods carry `<domain>/component`; the pod informer watches only those."""
    return f"{settings.domain}/component"


async def build_runtime(settings: Settings) -> ControllerRuntime:
    client = await KubeClient.connect(settings.kube_mode, namespace=settings.pod_namespace or None)
    registry = CollectorRegistry()
    metrics_for(registry)  # the work-queue families, shared by every reconciler added later
    factory = InformerFactory(client, registry=registry)
    informers = {res: factory.informer(res) for res in (*r.TF_RESOURCES, r.NODES)}
    informers[r.PODS] = factory.informer(r.PODS, label_selector=component_selector(settings))
    informers[r.PODS].add_index("node", node_name_index)
    informers[r.GPUS].add_index("node", node_name_index)
    informers[r.GPUS].add_label_index(f"{settings.domain}/gpupool")
    identity = default_identity(settings.pod_name)
    dynamic_config = DynamicConfig(settings.dynamic_config, interval=settings.dynamic_config_interval)
    events = EventRecorder(client, component="tensor-fusion-operator", instance=identity)
    runtime = ControllerRuntime(
        settings=settings, client=client, registry=registry, factory=factory, informers=informers,
        readiness=Readiness(), dynamic_config=dynamic_config, events=events, identity=identity)
    for informer in informers.values():
        runtime.readiness.set(_condition(informer), False, "waiting for the initial list")
    runtime.routes.extend(config_handlers(runtime.dynamic_config))
    if settings.leader_elect:
        runtime.elector = LeaderElector(
            client, namespace=settings.operator_namespace, identity=identity,
            lease_duration=settings.leader_lease_duration, renew_deadline=settings.leader_renew_deadline,
            retry_period=settings.leader_retry_period, on_started_leading=runtime.run_leader_tasks,
            registry=registry, release_timeout=RELEASE_TIMEOUT_S)
    return runtime


def configure(runtime: ControllerRuntime) -> None:
    """Attach the controller's services: routes (`runtime.routes`), leader-only tasks
    (`runtime.add_leader_task`) and tasks for every replica (`runtime.tasks`). The allocator,
    reconcilers, /api/allocation and /api/simulate-schedule are added here as they land."""
    from tfusion.controller.allocation import AllocatorService  # imports this module

    AllocatorService(runtime).attach()


async def ensure_namespace(client: KubeClient, name: str) -> None:
    """The Lease lives in the operator namespace. A cluster's chart creates it; the embedded server
    may not have it yet, so create it when missing (failures are only logged: RBAC may forbid it,
    and then the Lease errors say what is wrong)."""
    try:
        await client.get(r.NAMESPACES, name)
    except NotFound:
        try:
            await client.create(r.NAMESPACES, {"metadata": {"name": name}})
            log.info("created namespace %s for the leader Lease", name)
        except AlreadyExists:
            pass  # another replica was quicker
        except KubeError as exc:
            log.warning("namespace %s is missing and could not be created: %s", name, exc)
    except KubeError as exc:
        log.warning("cannot check namespace %s: %s", name, exc)


def _condition(informer: Informer) -> str:
    return f"informer {informer.name}"


async def _track_readiness(runtime: ControllerRuntime, informer: Informer) -> None:
    await informer.wait_synced()
    runtime.readiness.set(_condition(informer), True, f"synced, {len(informer)} objects")


async def run(settings: Settings, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    runtime = await build_runtime(settings)
    configure(runtime)
    await serve_runtime(runtime, task_status=task_status)


async def serve_runtime(runtime: ControllerRuntime, *,
                        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run everything in `runtime` until cancelled; `task_status.started(runtime)` once serving."""
    try:
        await _serve(runtime, task_status)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await runtime.client.close()


async def _serve(runtime: ControllerRuntime, task_status: TaskStatus[Any]) -> None:
    settings = runtime.settings
    sock = bind_socket(settings.controller_listen)
    host, port = sock.getsockname()[:2]
    runtime.address = (host, port)
    async with anyio.create_task_group() as tg:
        await tg.start(runtime.factory.run)
        await tg.start(runtime.dynamic_config.run)
        await tg.start(runtime.events.run)
        for informer in runtime.informers.values():
            tg.start_soon(_track_readiness, runtime, informer)
        for task in runtime.tasks:
            tg.start_soon(task)
        handlers = [*runtime.routes, *health_handlers(runtime.readiness), metrics_handler(runtime.registry)]
        # logging_config=None: Litestar would otherwise reconfigure the root logger of the process
        app = make_app(handlers, title="tfusion controller", logging_config=None)
        await tg.start(serve, app, sock)
        log.info("controller HTTP API listening on http://%s:%d", host, port)
        if runtime.elector is not None:
            await ensure_namespace(runtime.client, settings.operator_namespace)
            await tg.start(runtime.elector.run)
        else:
            leader = Gauge("tfusion_leader", "1 while this process is the leader, else 0",
                           registry=runtime.registry)
            leader.set(1)
            runtime._leading_without_election = True
            tg.start_soon(runtime.run_leader_tasks)
        task_status.started(runtime)
