"""A Manager per identity: one client, one informer cache, one metrics registry, the elector, the runnables.

Why: every role that talks to the API server as one identity must share one connection and one
cache, or the API server sees each object watched once per role and each role pays for its own
copy; and leader-only work must follow leadership exactly — start once the caches it reads have
synced and this replica leads, stop when it stops leading, and start again, working, when it leads
again. controller-runtime's Manager gives Go operators this; this is the same idea in plain anyio.

A cluster pod runs one role as one ServiceAccount, so one Manager. `--role=all` runs the
controller and the hypervisor as their own ServiceAccounts (`embedded/identities.py`), so each
has a Manager of its own beside the embedded stage's admin one: three in the process
(`--embedded-identities=admin` puts every role on the stage's one). Inside one Manager no resource
is watched twice with the same selectors; two consumers that declare different selectors get an
informer each, with exactly the objects they asked for.

- `cache.informer(resource, …)`: the shared informers, one per resource and selectors
  (see `InformerFactory`);
- `registry`: the Prometheus registry every role's `/metrics` serves;
- `events`: the shared core/v1 Event recorder (repeats are counted, as kube's correlator does);
- `add(runnable, leader_only=…)`: a coroutine function run until cancelled; leader-only ones run
  once per leadership term, each term after every informer of the cache has synced;
- `controller(name)`: a `ControllerBuilder` for a reconcile loop registered here.

Roles register in their `run()` before serving; `roles.py` starts the Managers after every role
has registered, so the first leadership term waits for every informer a role asked for.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from prometheus_client import CollectorRegistry, Gauge

from tfusion.kube.client import KubeClient, KubeError, live_clients
from tfusion.kube.clock import REAL_CLOCK, Clock
from tfusion.kube.events import EventRecorder
from tfusion.kube.informer import InformerFactory
from tfusion.kube.leader import LeaderElector
from tfusion.kube.reconciler import ControllerBuilder
from tfusion.kube.workqueue import metrics_for
from tfusion.settings import Settings

log = logging.getLogger(__name__)

Runnable = Callable[[], Awaitable[None]]

#: how long shutdown may spend releasing the Lease (roles.py allows ~4 s for everything)
RELEASE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class _Entry:
    name: str
    run: Runnable
    leader_only: bool


def stable_identity(settings: Settings) -> str:
    """The leader-election identity. A pod's name is unique and survives a container restart, and
    in `--role=all` the node name plus the state path names this installation: with a stable
    identity a restarted replica takes its own Lease back at once instead of waiting for it to
    expire. Anything else (a controller run by hand) gets a unique one: two processes with one
    identity would both think they lead."""
    if settings.pod_name:
        return settings.pod_name
    if "all" in settings.roles:
        state = str(Path(settings.state).expanduser().resolve())
        return f"{settings.resolved_node_name}-{hashlib.sha256(state.encode()).hexdigest()[:10]}"
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


class Manager:
    """See the module docstring. `client` is None for a process that needs no Kubernetes (the
    hypervisor's local backend): then only the registry and the runnables are there."""

    def __init__(self, settings: Settings, client: KubeClient | None, *, clock: Clock = REAL_CLOCK,
                 registry: CollectorRegistry | None = None, identity: str | None = None) -> None:
        self.settings = settings
        self._client = client
        self.clock = clock
        # auto_describe off: the hypervisor's custom collectors must not be collected at registration
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.identity = identity or stable_identity(settings)
        metrics_for(self.registry)  # the work-queue families, shared by every controller
        self._cache = InformerFactory(client, registry=self.registry, clock=clock) if client else None
        self.events = EventRecorder(client, component="tensor-fusion-operator", instance=self.identity) \
            if client else None
        self._entries: list[_Entry] = []
        self.elector: LeaderElector | None = None
        #: (host, port) of the controller's HTTP API, for the leader info (`advertise_api`)
        self.api_address: tuple[str, int] | None = None
        self._leading = False
        self._tg: TaskGroup | None = None
        self._term_tg: TaskGroup | None = None
        self.terms = 0
        clients = Gauge("tfusion_kube_clients", "Kubernetes API clients open in this process",
                        registry=self.registry)
        clients.set_function(lambda: float(live_clients()))
        informers = Gauge("tfusion_informers", "informers in this process's shared cache, by resource",
                          ["resource"], registry=self.registry)
        self._informer_gauge = informers
        #: made by `connect` (from settings), so it can open a second client for the Lease
        self._connected = False
        self._election_client: KubeClient | None = None

    @classmethod
    async def connect(cls, settings: Settings, **kwargs: Any) -> Manager:
        """A Manager with a client for `settings.kube_mode` (raises ValueError or KubeError)."""
        client = await KubeClient.connect(settings.kube_mode, namespace=settings.pod_namespace or None,
                                          qps=settings.kube_api_qps, burst=settings.kube_api_burst)
        manager = cls(settings, client, **kwargs)
        manager._connected = True
        return manager

    # --- what it owns ---------------------------------------------------------------------------

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            raise RuntimeError("this process runs without Kubernetes: the Manager has no client")
        return self._client

    @client.setter
    def client(self, client: KubeClient) -> None:
        self._client = client

    @property
    def has_client(self) -> bool:
        return self._client is not None

    @property
    def cache(self) -> InformerFactory:
        if self._cache is None:
            raise RuntimeError("this process runs without Kubernetes: the Manager has no cache")
        return self._cache

    @property
    def recorder(self) -> EventRecorder:
        if self.events is None:
            raise RuntimeError("this process runs without Kubernetes: the Manager has no event recorder")
        return self.events

    @property
    def is_leader(self) -> bool:
        return self._leading

    def advertise_api(self, host: str, port: int) -> None:
        """The controller's HTTP API is bound to host:port: the leader writes it to its leader info
        (kube/leader.py `api-url`), where `tfusion why` and the console look for the controller."""
        self.api_address = (host, port)
        if self.elector is not None:
            self.elector.advertise(host, port)

    def controller(self, name: str) -> ControllerBuilder:
        return ControllerBuilder(self, name)

    def add(self, runnable: Runnable, *, leader_only: bool, name: str = "") -> None:
        """Register a coroutine function that runs until cancelled. Added while running, it starts
        at once (a leader-only one in the current term, if this replica leads)."""
        entry = _Entry(name or getattr(runnable, "__qualname__", repr(runnable)), runnable, leader_only)
        self._entries.append(entry)
        if not leader_only and self._tg is not None:
            self._tg.start_soon(self._guard, entry)
        elif leader_only and self._term_tg is not None:
            self._term_tg.start_soon(self._guard, entry)

    @property
    def runnables(self) -> list[str]:
        return [entry.name for entry in self._entries]

    # --- running --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[Manager] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the cache, the event recorder, every runnable and leader election; run until
        cancelled, then stop in reverse (the Lease is released, the client closed)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self._cache is not None:
                    for informer in self._cache.informers:
                        self._informer_gauge.labels(informer.resource.name).inc()
                    await tg.start(self._cache.run)
                if self.events is not None:
                    await tg.start(self.events.run)
                for entry in self._entries:
                    if not entry.leader_only:
                        tg.start_soon(self._guard, entry)
                if any(entry.leader_only for entry in self._entries):
                    await self._start_leading_or_election(tg)
                task_status.started(self)
        finally:
            self._tg = None
            for client in (self._client, self._election_client):
                if client is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        await client.close()

    async def _start_leading_or_election(self, tg: TaskGroup) -> None:
        settings = self.settings
        if not settings.leader_elect:
            Gauge("tfusion_leader", "1 while this process is the leader, else 0", registry=self.registry).set(1)
            tg.start_soon(self._lead)
            return
        await self._ensure_namespace(settings.operator_namespace)
        self.elector = LeaderElector(
            await self._lease_client(), namespace=settings.operator_namespace, identity=self.identity,
            lease_duration=settings.leader_lease_duration, renew_deadline=settings.leader_renew_deadline,
            retry_period=settings.leader_retry_period, on_started_leading=self._lead,
            registry=self.registry, release_timeout=RELEASE_TIMEOUT_S, clock=self.clock,
            pod_name=settings.pod_name, pod_namespace=settings.pod_namespace, api_address=self.api_address)
        await tg.start(self.elector.run)

    async def _lease_client(self) -> KubeClient:
        """The Lease's own client, as client-go's leader election has: a new leader's first
        minutes are a storm of writes (every GPU's and workload's status at 100,000 pods), and a
        renewal queued behind them in one connection pool and rate limiter misses its deadline
        and ends the term. A Manager given its client (tests) shares that one."""
        if not self._connected:
            return self.client
        settings = self.settings
        self._election_client = await KubeClient.connect(
            settings.kube_mode, namespace=settings.pod_namespace or None, qps=settings.kube_api_qps,
            burst=settings.kube_api_burst)
        return self._election_client

    async def _lead(self) -> None:
        """One leadership term: wait for the caches, then run every leader-only runnable until
        cancelled (the elector cancels this when the Lease is lost)."""
        self.terms += 1
        term = self.terms
        self._leading = True
        try:
            if self._cache is not None:
                await self._cache.wait_synced()
            log.info("leadership term %d: starting %d leader-only runnable(s)", term,
                     sum(e.leader_only for e in self._entries))
            async with anyio.create_task_group() as tg:
                self._term_tg = tg
                for entry in self._entries:
                    if entry.leader_only:
                        tg.start_soon(self._guard, entry)
                await anyio.sleep_forever()
        finally:
            self._term_tg = None
            self._leading = False
            log.info("leadership term %d ended", term)

    async def _guard(self, entry: _Entry) -> None:
        """A runnable that returns or fails must not take the process down: log it, and restart
        a failed one after a pause (a bug should be loud, not fatal to leader election)."""
        while True:
            try:
                await entry.run()
                log.info("runnable %s finished", entry.name)
                return
            except Exception:
                log.exception("runnable %s failed; restarting it in 5 s", entry.name)
            await self.clock.sleep(5.0)

    async def _ensure_namespace(self, name: str) -> None:
        """The Lease lives in the operator namespace. A cluster's install creates it; the embedded
        server may not have it yet (failures are only logged: the Lease errors then say why)."""
        from tfusion.kube.client import AlreadyExists, NotFound
        from tfusion.kube.resources import NAMESPACES

        try:
            await self.client.get(NAMESPACES, name)
        except NotFound:
            try:
                await self.client.create(NAMESPACES, {"metadata": {"name": name}})
                log.info("created namespace %s for the leader Lease", name)
            except AlreadyExists:
                pass
            except KubeError as exc:
                log.warning("namespace %s is missing and could not be created: %s", name, exc)
        except KubeError as exc:
            log.warning("cannot check namespace %s: %s", name, exc)
