"""The controller role: registers the controller's work on the process's Manager and serves its HTTP API.

Every replica reads the shared informers (the 12 tensor-fusion.ai kinds, nodes, and our own
pods), watches the dynamic config and serves `/healthz`, `/readyz`, `/metrics` and `/api/*`. The
leader-only work (allocator feed and status reconcilers, sweeps, …) is registered with the
Manager, which starts it once the caches have synced and this replica leads, cancels it when it
stops leading, and starts it again when it leads again. `configure()` builds the services on a
`ControllerRuntime` (runtime.py), handing each the others it uses. Cancellation (SIGTERM in
roles.py) closes the server; the Manager releases the Lease.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from tfusion.controller.dynamic_config import DynamicConfig
from tfusion.controller.http import config_handlers
from tfusion.controller.runtime import ControllerRuntime, component_selector
from tfusion.errors import RoleError
from tfusion.kube import resources as r
from tfusion.kube.informer import Informer, node_name_index
from tfusion.kube.manager import Manager
from tfusion.kube.transforms import transform_for
from tfusion.settings import Settings
from tfusion.web import Readiness, bind_socket, health_handlers, make_app, metrics_handler, serve

if TYPE_CHECKING:
    from tfusion.controller.alerts import AlertEvaluator
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.autoscaler.service import Autoscaler
    from tfusion.controller.metrics import ControllerRecorder
    from tfusion.controller.provisioning.service import Provisioning
    from tfusion.controller.reconcilers import Reconcilers
    from tfusion.controller.scheduling.assignments import Assignments
    from tfusion.controller.scheduling.scheduler import Scheduler
    from tfusion.controller.webhook.service import WebhookService

log = logging.getLogger(__name__)

# ControllerRuntime and component_selector live in runtime.py; named here too for the role's callers
__all__ = ["ControllerRole", "ControllerRuntime", "build_runtime", "component_selector", "configure", "run",
           "serve_runtime"]


@dataclass
class ControllerRole(ControllerRuntime):
    """The controller role as configured: its runtime plus the services `configure()` built on it,
    which is what the process (readiness, `--role=all`'s summary, tests) looks at. No service is
    handed this object; each gets the plain `ControllerRuntime` and, as constructor arguments, the
    other services it uses."""

    allocation: AllocatorService | None = None
    #: the index and port allocators (with the webhook; always built)
    assignments: Assignments | None = None
    #: the pod webhook (None when ENABLE_WEBHOOKS=false); `.address` is its bound port
    webhook: WebhookService | None = None
    #: None with ENABLE_CR_CONTROLLER=false
    reconcilers: Reconcilers | None = None
    #: None with ENABLE_SCHEDULER=false
    scheduler: Scheduler | None = None
    metrics: ControllerRecorder | None = None
    autoscaler: Autoscaler | None = None
    #: provisioning (claims, pool gaps, expander, compaction); None with ENABLE_CR_CONTROLLER=false
    provisioning: Provisioning | None = None
    #: the dynamic config's alertRules evaluator (leader only); None without --enable-alert
    alerts: AlertEvaluator | None = None


async def build_runtime(settings: Settings, manager: Manager | None = None) -> ControllerRole:
    """The controller's runtime on `manager` (the process's; None: a Manager of its own, which
    `serve_runtime` then runs)."""
    owns = manager is None
    if manager is None:
        manager = await Manager.connect(settings)
    cache = manager.cache
    if cache_is_ours(settings):
        for resource in PRUNED_RESOURCES:
            cache.set_transform(resource, transform_for(resource))
    informers = {res: cache.informer(res) for res in (*r.TF_RESOURCES, r.NODES)}
    informers[r.PODS] = cache.informer(r.PODS, label_selector=component_selector(settings))
    informers[r.PODS].add_index("node", node_name_index)
    informers[r.GPUS].add_index("node", node_name_index)
    informers[r.GPUS].add_label_index(f"{settings.domain}/gpupool")
    dynamic_config = DynamicConfig(settings.dynamic_config, interval=settings.dynamic_config_interval)
    runtime = ControllerRole(settings=settings, manager=manager, readiness=Readiness(),
                             dynamic_config=dynamic_config, informers=informers, owns_manager=owns)
    runtime.routes.extend(config_handlers(runtime.dynamic_config))
    return runtime


#: the kinds the controller's cache holds by the thousand, whose unread fields it drops
#: (kube/transforms.py PRUNED) and whose common subtrees it keeps once (SHARED_PATHS); workloads
#: (one per Deployment) are the only owner objects it caches
PRUNED_RESOURCES = (r.PODS, r.NODES, r.GPUS, r.TENSORFUSIONWORKLOADS)


def cache_is_ours(settings: Settings) -> bool:
    """Whether nothing but the controller reads this process's cache, so that it may drop what the
    controller does not read: a `--role=controller` process with no embedded stage beside it (the
    stage's simulated kubelet and workload controllers read pods whole; roles.py starts the stage
    for an embedded API server or a simulated kubelet)."""
    return (tuple(settings.roles) == ("controller",) and settings.kube_mode != "embedded"
            and not settings.runs_simulated_kubelet)


def configure(controller: ControllerRole) -> None:
    """Build the controller's services on its runtime, in this order, each given the ones it uses:
    the allocator service, the index and port allocators with the pod webhook, the reconcilers (not
    with ENABLE_CR_CONTROLLER=false), the connection and usage routes, the scheduler, the metrics recorder, the
    autoscaler, provisioning, the alert facts and alertRules evaluator.
    Each registers its informers, routes and runnables on the runtime and its Manager."""
    # imported here, not at the top: build_runtime() alone (a bare controller, in tests) needs none
    from tfusion.controller.alerts import attach_alerts
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.autoscaler.service import attach_autoscaler
    from tfusion.controller.connection_http import attach_connection_route
    from tfusion.controller.metrics import attach_metrics
    from tfusion.controller.provisioning.service import attach_provisioning
    from tfusion.controller.reconcilers import register_reconcilers
    from tfusion.controller.scheduling.assignments import Assignments
    from tfusion.controller.scheduling.scheduler import attach_scheduler
    from tfusion.controller.usage_http import attach_usage_route
    from tfusion.controller.webhook.service import attach_webhook

    runtime: ControllerRuntime = controller
    allocation = controller.allocation = AllocatorService(runtime).attach()
    assignments = controller.assignments = Assignments(runtime).attach()
    # a pod's index and host port go with its GPUs, in one release
    allocation.release_hooks.append(assignments.release_pod)
    controller.webhook = attach_webhook(runtime, assignments)
    if runtime.settings.enable_cr_controller:
        controller.reconcilers = register_reconcilers(runtime, allocation, assignments)
    attach_connection_route(runtime, assignments)
    attach_usage_route(runtime)
    controller.scheduler = attach_scheduler(runtime, allocation)
    allocation.scheduler = controller.scheduler  # simulate-schedule asks it, when there is one
    controller.metrics = attach_metrics(runtime, allocation)
    controller.autoscaler = attach_autoscaler(runtime, allocation)
    controller.provisioning = attach_provisioning(controller, controller.reconcilers, controller.scheduler)
    controller.alerts = attach_alerts(runtime, controller.webhook)


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


async def serve_runtime(runtime: ControllerRole, *,
                        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve the controller's HTTP API until cancelled; `task_status.started(runtime)` once
    serving. A runtime that owns its Manager runs it too (else roles.py runs the shared one)."""
    settings = runtime.settings
    sock = _bind("--controller-listen", settings.resolved_controller_listen)
    probe_sock = _bind("--health-probe-bind-address", settings.resolved_health_probe_listen)
    host, port = sock.getsockname()[:2]
    runtime.address = (host, port)
    runtime.manager.advertise_api(host, port)
    runtime.probe_address = probe_sock.getsockname()[:2]
    async with anyio.create_task_group() as tg:
        await tg.start(runtime.dynamic_config.run)
        watched = {_condition(informer): informer for informer in runtime.informers.values()}
        for condition, informer in (watched | runtime.other_informers).items():
            runtime.readiness.set(condition, False, f"waiting for the initial list ({informer.name})")
            tg.start_soon(_track_readiness, runtime, condition, informer)
        for task in runtime.tasks:
            tg.start_soon(task)
        bake = runtime.metrics.bake_for_scrape if runtime.metrics is not None else None
        handlers = [*runtime.routes, *health_handlers(runtime.readiness), metrics_handler(runtime.registry, bake)]
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
