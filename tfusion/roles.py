"""Runs the selected roles in one anyio task group and stops them on SIGINT/SIGTERM.

Each role lives in `tfusion/<role>/role.py` as `async def run(settings, *, task_status, manager)`;
it registers what it needs with its identity's Manager (informers, runnables, controllers),
calls `task_status.started(...)` once it serves, and cleans up when cancelled. The embedded API
server starts first, so the others get its kubeconfig; then the embedded stage (bootstrap,
simulated kubelet) and the roles register, each on the Manager of the ServiceAccount it runs as
(`embedded/identities.py`); then the Managers start, so each knows every informer its roles asked
for before its first leadership term. On a signal everything stops in reverse order.
"""

from __future__ import annotations

import importlib
import logging
import signal
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from tfusion.errors import RoleError
from tfusion.kube.client import KubeError
from tfusion.kube.manager import Manager
from tfusion.settings import Settings, format_listen

log = logging.getLogger("tfusion")

RoleRunner = Callable[..., Awaitable[Any]]

#: the shutdown budget after a signal: roles get this long to release leases and close servers
SHUTDOWN_GRACE_S = 4.0


def load_role(role: str) -> RoleRunner:
    module_name = f"tfusion.{role}.role"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise RoleError(f"role {role!r} is not built yet in this version of tfusion") from None
        raise
    runner: RoleRunner = module.run
    return runner


def planned_roles(settings: Settings) -> list[str]:
    """The role modules this process starts, in start order."""
    wanted = ["apiserver", "controller", "hypervisor"] if "all" in settings.roles else list(settings.roles)
    if settings.kube_mode == "embedded" and "apiserver" not in wanted:
        wanted.insert(0, "apiserver")
    order = {"apiserver": 0, "controller": 1, "hypervisor": 2}
    return sorted(dict.fromkeys(wanted), key=order.__getitem__)


def backend_options(settings: Settings) -> dict[str, Any]:
    """anyio's asyncio options for `--event-loop`. uvloop is the same asyncio API on libuv: about 5 %
    less CPU per scheduled pod in the embedded API server and in the controller, but a longer tail
    where each request is CPU-heavy (the webhook's first pods at c=10: p99 5.5 ms against 3.8 ms on
    asyncio), so `auto` takes it only for a process that is the API server alone, whose CPU per
    request bounds the pods a cluster schedules (docs/performance.md)."""
    if settings.event_loop == "auto":
        return {"use_uvloop": planned_roles(settings) == ["apiserver"]}
    return {"use_uvloop": settings.event_loop == "uvloop"}


def run(settings: Settings) -> int:
    runners = {role: load_role(role) for role in planned_roles(settings)}
    try:
        return anyio.run(_run_all, settings, runners, backend_options=backend_options(settings))
    except BaseExceptionGroup as group:  # a role that failed to start: report its RoleError, not the group
        role_error = _first_role_error(group)
        if role_error is None:
            raise
        raise role_error from None


def _first_role_error(group: BaseExceptionGroup[BaseException]) -> RoleError | None:
    for exc in group.exceptions:
        if isinstance(exc, RoleError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_role_error(exc)
            if found is not None:
                return found
    return None


async def _run_all(settings: Settings, runners: dict[str, RoleRunner]) -> int:
    """Start roles in order; on a signal stop them in reverse order, so the controller can still
    release its Lease through the embedded API server before that server closes."""
    stop = anyio.Event()
    embedded = settings.kube_mode == "embedded"
    started: dict[str, Any] = {}  # role -> what it passed to task_status.started
    async with anyio.create_task_group() as outer:
        outer.start_soon(_stop_on_signal, stop, outer.cancel_scope)
        if "apiserver" in runners:
            api = started["apiserver"] = await outer.start(
                _started, "apiserver", runners.pop("apiserver"), settings, None)
            if settings.kube_mode == "embedded":
                # no kube-scheduler runs beside the embedded API server: the built-in one places every pod
                settings = settings.replace(kube=api.kubeconfig, schedule_default_pods=True)
        from tfusion.embedded.stage import launch_stage  # CRDs, defaults, simulated kubelet, sim-GPU fallback

        manager = await _manager_for(settings, runners, embedded)
        async with anyio.create_task_group() as middle:  # the stage stops after the roles, before the API server
            stage = await launch_stage(middle, settings, roles=tuple(runners), embedded=embedded, manager=manager)
            settings = stage.settings
            # in --role=all the controller and the hypervisor run as their own ServiceAccounts
            from tfusion.embedded.identities import role_managers

            own = await role_managers(settings, tuple(runners), manager, embedded=embedded)
            async with anyio.create_task_group() as inner:
                for role, runner in runners.items():
                    started[role] = await inner.start(_started, role, runner, settings, own.get(role, manager))
                await inner.start(manager.run)
                for role_manager in own.values():
                    await inner.start(role_manager.run)
                await _admit_pods_once_webhook_registered(started, inner)
                log.info("tfusion running roles: %s", ", ".join(settings.roles))
                if embedded and settings.console_listen != "off":
                    started["console"] = await inner.start(_console, settings, started)
                stage.announce(started)
                await stop.wait()
                inner.cancel_scope.cancel()
            middle.cancel_scope.cancel()
        outer.cancel_scope.cancel()
    return 0


async def _admit_pods_once_webhook_registered(started: dict[str, Any], tg: TaskGroup, seconds: float = 60.0) -> None:
    """Release the embedded API server's hold on pod creates once the controller in this process
    has registered its pod webhook, so no pod is stored unmutated; announced after that, the
    summary's "tfusion is running" means pods can be created. Past `seconds` start-up goes on and
    the hold is released in `tg` whenever the webhook is registered (until then pod creates
    answer 503 with the reason)."""
    hold = getattr(started.get("apiserver"), "pod_create_hold", None)
    runtime = started.get("controller")
    if hold is None or runtime is None:
        return
    from tfusion.controller.webhook.service import CONDITION

    async def release_once_registered() -> None:
        while not runtime.readiness.holds(CONDITION):
            await anyio.sleep(0.05)
        hold.release()

    with anyio.move_on_after(seconds):
        await release_once_registered()
        return
    log.warning("the pod webhook is not registered after %g s: pod creates wait for it (see /readyz)", seconds)
    tg.start_soon(release_once_registered)


async def _console(settings: Settings, started: dict[str, Any], *,
                   task_status: TaskStatus[str | None] = anyio.TASK_STATUS_IGNORED) -> None:
    """`--role=all` serves the console too: as the kubeconfig's admin, asking the controller it runs."""
    from tfusion.console.cli import ConsoleOptions, serve_console

    address = getattr(started.get("controller"), "address", None)
    controller = f"http://{format_listen(*address)}" if address else ""
    metrics = settings.resolved_metrics_path
    options = ConsoleOptions(settings.kube, settings.console_listen, controller,
                             metrics_dir=str(metrics.parent) if metrics is not None else "",
                             operator_namespace=settings.operator_namespace)
    status = _TrackedStatus(task_status)
    try:
        await serve_console(options, task_status=status)
    except* (OSError, KubeError) as group:
        if status.serving:
            raise
        # the roles serve without it: a taken port must not stop the cluster
        log.warning("the console is not served: %s (set --console-listen to another address, or off)",
                    "; ".join(map(str, group.exceptions)))
        task_status.started(None)


class _TrackedStatus:
    """Forwards `task_status.started()` and remembers that the role got that far."""

    def __init__(self, inner: TaskStatus[Any]) -> None:
        self._inner = inner
        self.serving = False

    def started(self, value: Any = None) -> None:
        self.serving = True
        self._inner.started(value)


def needs_kube(settings: Settings, roles: Collection[str], embedded: bool) -> bool:
    """Whether this process talks to an API server (else its Manager has no client)."""
    return embedded or settings.runs_simulated_kubelet or "controller" in roles or (
        "hypervisor" in roles and settings.backend == "kubernetes")


async def _manager_for(settings: Settings, roles: Collection[str], embedded: bool) -> Manager:
    if not needs_kube(settings, roles, embedded):
        return Manager(settings, None)
    try:
        return await Manager.connect(settings)
    except (ValueError, KubeError) as exc:
        raise RoleError(f"cannot use the API server: {exc}") from None


async def _started(role: str, runner: RoleRunner, settings: Settings, manager: Manager | None, *,
                   task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run one role. A configuration it cannot use, or an API server it cannot reach, before it
    serves is the caller's problem, not a crash: it becomes a one-line RoleError."""
    status = _TrackedStatus(task_status)
    try:
        if manager is None:  # the API server, which serves the others and needs no Manager
            await runner(settings, task_status=status)
        else:
            await runner(settings, task_status=status, manager=manager)
    except (ValueError, KubeError) as exc:
        if status.serving:
            raise
        raise RoleError(f"{role}: {exc}") from None


async def _stop_on_signal(stop: anyio.Event, startup_scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stop.set()
            # A second signal means "now": cancel everything, including roles still starting.
            async for _ in signals:
                startup_scope.cancel()
                return
