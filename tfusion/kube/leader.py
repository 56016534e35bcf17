"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

Only one controller replica may run the reconcilers and the allocator. Candidates poll the Lease
every `retry_period`; a holder's lease counts as expired only when its record has not changed for
`lease_duration` as measured by *our* monotonic clock (never by comparing the remote renewTime
with our wall clock). Every write is a PUT conditioned on the resourceVersion we read, so two
candidates cannot both win. A leader that has not renewed for `renew_deadline` (< lease
duration) stops its leader-only work first, so it is gone before anyone else may take over. On a
clean shutdown the leader releases the Lease (holderIdentity "", leaseDurationSeconds 1) so a
standby takes over within one retry period.

The leader also keeps ConfigMap `tensor-fusion-operator-leader-info` current: `leader-ip` (how
followers of the original find the leader) and, for clients such as `tfusion why` and the console
(tfusion/console/locate.py), `api-url` (where the leader's HTTP API answers, once the controller
role has told the elector through `advertise`), `pod` and `pod-namespace` (the leader's pod, for a
port-forward when `api-url` cannot be reached from outside the cluster).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Gauge

from tfusion.api.accessors import Body, section, text
from tfusion.api.timestamps import micro_time as micro_time  # re-exported for the kubelet
from tfusion.kube.client import AlreadyExists, Conflict, KubeClient, KubeError, NotFound
from tfusion.kube.clock import REAL_CLOCK, Clock
from tfusion.kube.resources import CONFIGMAPS, LEASES

log = logging.getLogger(__name__)

LEASE_NAME = "85104305.tensor-fusion.ai"
LEADER_INFO_CONFIGMAP = "tensor-fusion-operator-leader-info"
LEADER_IP_KEY = "leader-ip"
API_URL_KEY = "api-url"
POD_KEY = "pod"
POD_NAMESPACE_KEY = "pod-namespace"
_LEADER_KEYS = (LEADER_IP_KEY, API_URL_KEY, POD_KEY, POD_NAMESPACE_KEY)
_WILDCARDS = ("", "0.0.0.0", "::")

Callback = Callable[[], Awaitable[None] | None]


def default_identity(pod_name: str = "") -> str:
    """Unique per process: two replicas with one identity would both think they lead."""
    return f"{pod_name or socket.gethostname()}_{uuid.uuid4().hex[:10]}"


def first_ipv4() -> str:
    """The first non-loopback IPv4 address of this host, or 127.0.0.1."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("10.254.254.254", 1))  # no packet is sent; this only picks a route
        address: str = sock.getsockname()[0]
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = str(info[4][0])
            if not address.startswith("127."):
                return address
    return "127.0.0.1"


def api_url(host: str, port: int, own_ip: str) -> str:
    """The base URL a client reaches a server bound to host:port with: the bound address itself,
    or `own_ip` (this host's first IPv4: the pod IP in a pod) for a wildcard bind, which a loopback
    address would hide from every other host."""
    address = own_ip if host in _WILDCARDS else host
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


class _Attempt(enum.Enum):
    ACQUIRED = "acquired"
    HELD = "held by another"
    FAILED = "failed"


async def _call(callback: Callback | None) -> None:
    if callback is None:
        return
    result = callback()
    if inspect.isawaitable(result):
        await result


class LeaderElector:
    """Run with `run()`; `on_started_leading` runs while leading and is cancelled on loss."""

    def __init__(self, client: KubeClient, *, namespace: str = "tensor-fusion-sys", name: str = LEASE_NAME,
                 identity: str | None = None, pod_name: str = "", lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0,
                 on_started_leading: Callback | None = None, on_stopped_leading: Callback | None = None,
                 registry: CollectorRegistry | None = None, leader_info: bool = True,
                 leader_info_interval: float = 30.0, release_timeout: float = 2.0,
                 clock: Clock = REAL_CLOCK, pod_namespace: str = "",
                 api_address: tuple[str, int] | None = None) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError(f"leader election needs lease_duration ({lease_duration}) > renew_deadline "
                             f"({renew_deadline}) > retry_period ({retry_period}) > 0")
        self.client = client
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity(pod_name)
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.leader_info = leader_info
        self.leader_info_interval = leader_info_interval
        self.release_timeout = release_timeout
        self.pod_name = pod_name
        self.pod_namespace = pod_namespace
        #: (host, port) the controller's HTTP API is bound to; written as `api-url` once known
        self.api_address = api_address
        self._info_changed: anyio.Event | None = None  # set by advertise(): write the info again now
        self._leading = False
        self._lease: Mapping[str, Any] | None = None  # the Lease as we last wrote or read it
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._acquired_at = 0.0
        self.observed_holder: str = ""
        self.transitions = 0
        self._gauge = Gauge("tfusion_leader", "1 while this process holds the leader Lease, else 0",
                            registry=registry if registry is not None else CollectorRegistry())
        self._gauge.set(0)

    @property
    def is_leader(self) -> bool:
        return self._leading

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Campaign, lead, and campaign again after a loss, until cancelled; then release."""
        task_status.started()
        try:
            while True:
                await self._acquire()
                await self._lead()
        finally:
            if text(self._lease, "spec", "holderIdentity") == self.identity:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.release_timeout):
                    await self.release()

    async def _acquire(self) -> None:
        log.info("leader election: %s campaigning for lease %s/%s", self.identity, self.namespace, self.name)
        while True:
            started = self.clock.now()
            with self.clock.move_on_after(self.renew_deadline):
                if await self._try_acquire_or_renew() is _Attempt.ACQUIRED:
                    self._acquired_at = started
                    return
            await self.clock.sleep(self.retry_period)

    async def _lead(self) -> None:
        log.info("leader election: %s is now the leader", self.identity)
        self._set_leading(True)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, self.on_started_leading)
                if self.leader_info:
                    tg.start_soon(self._keep_leader_info)
                await self._renew_until_lost()
                tg.cancel_scope.cancel()
        finally:
            self._set_leading(False)
            log.warning("leader election: %s stopped leading", self.identity)
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.release_timeout):
                try:
                    await _call(self.on_stopped_leading)
                except Exception:
                    log.exception("on_stopped_leading failed")

    async def _renew_until_lost(self) -> None:
        # measured from when the successful attempt *started*: the renewTime it wrote is older
        # than its answer, and the others count the lease from what they saw
        last_renew = self._acquired_at
        margin = min(0.5, self.renew_deadline * 0.1)  # stop a little before the deadline, not after
        while True:
            await self.clock.sleep(self.retry_period)
            with self.clock.move_on_after(last_renew + self.renew_deadline - margin - self.clock.now()):
                while True:
                    started = self.clock.now()
                    attempt = await self._try_acquire_or_renew()
                    if attempt is _Attempt.ACQUIRED:
                        last_renew = started
                        break
                    if attempt is _Attempt.HELD:
                        log.warning("leader election: lease taken by %s", self.observed_holder)
                        return
                    await self.clock.sleep(self.retry_period)
                continue
            log.error("leader election: %s could not renew within %.1fs", self.identity, self.renew_deadline)
            return

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        self._gauge.set(1 if leading else 0)

    # --- one step ---------------------------------------------------------------------------------

    @staticmethod
    def _record(lease: Body) -> tuple[Any, ...]:
        """The fields every write of the lease changes: while they stay the same, nobody renewed it."""
        spec = lease.spec
        return (text(spec, "holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
                spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))

    async def _try_acquire_or_renew(self) -> _Attempt:
        now = micro_time()
        try:
            lease = await self.client.get(LEASES, self.name, namespace=self.namespace)
        except NotFound:
            return await self._create(now)
        except KubeError as exc:
            log.warning("leader election: cannot read lease %s/%s: %s", self.namespace, self.name, exc)
            return _Attempt.FAILED
        spec = dict(Body(lease).spec)
        holder = text(spec, "holderIdentity")
        record = self._record(Body(lease))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock.now()
        self.observed_holder = holder
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and self.clock.now() < self._observed_at + duration:
            self._lease = lease
            return _Attempt.HELD
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.lease_duration),
                    renewTime=now)
        if holder != self.identity:
            spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        # replace() sends the resourceVersion we read: a concurrent writer makes this a 409
        try:
            written = await self.client.replace(LEASES, {**lease, "spec": spec}, namespace=self.namespace)
        except Conflict:
            return _Attempt.FAILED
        except KubeError as exc:
            log.warning("leader election: cannot update lease: %s", exc)
            return _Attempt.FAILED
        self._remember(Body(written))
        return _Attempt.ACQUIRED

    async def _create(self, now: str) -> _Attempt:
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.name, "namespace": self.namespace},
                 "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                          "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            written = await self.client.create(LEASES, lease, namespace=self.namespace)
        except AlreadyExists:
            return _Attempt.FAILED
        except KubeError as exc:
            log.warning("leader election: cannot create lease %s/%s: %s", self.namespace, self.name, exc)
            return _Attempt.FAILED
        self._remember(Body(written))
        return _Attempt.ACQUIRED

    def _remember(self, lease: Body) -> None:
        self._lease = lease.raw
        self.observed_holder = self.identity
        self.transitions = int(lease.spec.get("leaseTransitions") or 0)
        self._observed = self._record(lease)
        self._observed_at = self.clock.now()

    async def release(self) -> bool:
        """Give the lease up (holderIdentity "", leaseDurationSeconds 1) if we still hold it."""
        lease = self._lease
        for _ in range(2):
            if lease is None or text(lease, "spec", "holderIdentity") != self.identity:
                return False
            now = micro_time()
            spec = {**Body(lease).spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                    "renewTime": now, "acquireTime": now}
            try:
                released = {**lease, "spec": spec}
                self._lease = await self.client.replace(LEASES, released, namespace=self.namespace)
                log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
                return True
            except Conflict:
                lease = await self.client.get(LEASES, self.name, namespace=self.namespace)
            except KubeError as exc:
                log.warning("leader election: release failed: %s", exc)
                return False
        return False

    # --- leader info ------------------------------------------------------------------------------

    def advertise(self, host: str, port: int) -> None:
        """Where the controller's HTTP API is bound; a leader rewrites its leader info at once."""
        self.api_address = (host, port)
        if self._info_changed is not None:
            self._info_changed.set()

    async def _keep_leader_info(self) -> None:
        while True:
            self._info_changed = anyio.Event()
            try:
                await self.write_leader_info()
            except KubeError as exc:
                log.warning("leader election: cannot write ConfigMap %s: %s", LEADER_INFO_CONFIGMAP, exc)
            with self.clock.move_on_after(self.leader_info_interval):
                await self._info_changed.wait()

    def leader_info_data(self, ip: str) -> dict[str, str]:
        """The ConfigMap's data as this leader writes it; keys without a value are left out."""
        data = {LEADER_IP_KEY: ip}
        if self.api_address is not None:
            data[API_URL_KEY] = api_url(*self.api_address, ip)
        if self.pod_name:
            data[POD_KEY] = self.pod_name
            data[POD_NAMESPACE_KEY] = self.pod_namespace or self.namespace
        return data

    async def write_leader_info(self, ip: str | None = None) -> None:
        if not ip:
            ip = await anyio.to_thread.run_sync(first_ipv4)
        data = self.leader_info_data(ip)
        try:
            current = await self.client.get(CONFIGMAPS, LEADER_INFO_CONFIGMAP, namespace=self.namespace)
        except NotFound:
            try:
                await self.client.create(CONFIGMAPS, {"metadata": {"name": LEADER_INFO_CONFIGMAP,
                                                                   "namespace": self.namespace},
                                                      "data": data}, namespace=self.namespace)
                return
            except AlreadyExists:
                current = await self.client.get(CONFIGMAPS, LEADER_INFO_CONFIGMAP, namespace=self.namespace)
        written = section(current, "data")
        # a key this leader has no value for is removed: a previous leader's pod must not stay named
        patch: dict[str, str | None] = {key: data.get(key) for key in _LEADER_KEYS if written.get(key) != data.get(key)}
        if patch:
            await self.client.patch(CONFIGMAPS, LEADER_INFO_CONFIGMAP, {"data": patch}, namespace=self.namespace)
