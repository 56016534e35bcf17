"""TensorFusionConnection reconciler: each remote client's connection gets a worker, and its status
says where that worker is.

- A connection of a **dynamic** workload (no `spec.replicas`) gets a dedicated worker pod named
  like the connection and controlled by it (annotation `dedicated-worker: "true"`); a worker whose
  template hash is no longer the workload's, that finished, or that is gone is replaced.
- A connection of a **fixed** workload (`spec.replicas`) is given one of the workload's serving
  workers, the one with the fewest Running connections (ties: by name), so no worker has more than
  one connection above another; label `worker-name` says which. No serving worker: Pending, and
  the connection is looked at again in 6 s (and at once when a worker changes).
- Status: `phase` Pending until the worker is Running with an address, then Running with
  `workerName` and `connectionURL` (`native+<podIP>+<port>+<worker>-<resourceVersion>`, kept while
  the same worker serves). When the worker fails, is deleted or disappears: Failed with an empty
  URL, then a new worker as above. Events: WorkerCreated, WorkerSelected, ConnectionReady,
  WorkerLost.
- A connection is owned by its client pod (the Pod reconciler creates it), so it goes with the pod,
  and a dedicated worker goes with its connection.

Triggers: the connection itself; worker pods (their owner connection, the connections they serve,
and the not-yet-Running connections of their workload); workloads (their connections); spec
changes of pools (the connections of their workloads).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, GpuPool, Pod, Workload, text
from tfusion.controller.reconcilers.common import (
    FAILED,
    PENDING,
    RUNNING,
    controlled_by,
)
from tfusion.controller.reconcilers.workers import (
    TemplateError,
    connection_url,
    label_value,
    serving,
    template_hash,
    url_of_same_worker,
    worker_pod,
)
from tfusion.controller.reconcilers.workload import WORKLOAD_INDEX, is_dynamic, workloads_of_pool
from tfusion.controller.runtime import component_selector
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, NotFound
from tfusion.kube.ownership import controller_reference
from tfusion.kube.reconciler import Result, generation_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.assignments import Assignments

log = logging.getLogger(__name__)

NO_WORKER_RETRY_S = 6.0
CONNECTION_WORKLOAD_INDEX = "connection:workload"
CONNECTION_WORKER_INDEX = "connection:worker"


def connection_workload(conn: Body) -> list[str]:
    """"namespace/workload" of a connection."""
    name = text(conn.spec, "workloadName")
    return [f"{conn.namespace}/{name}"] if name else []


def connection_worker(conn: Body) -> list[str]:
    """"namespace/worker" of a connection that a worker serves now (its Running status)."""
    worker = text(conn.status, "workerName")
    if conn.phase != RUNNING or not worker:
        return []
    return [f"{conn.namespace}/{worker}"]


def is_connected(conn: Body) -> bool:
    return conn.phase == RUNNING and bool(text(conn.status, "connectionURL"))


def _key(obj: Body) -> str:
    return f"{obj.namespace}/{obj.name}"


class ConnectionReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime, assignments: Assignments) -> None:
        self.runtime = runtime
        self.assignments = assignments
        self.connections = runtime.informer(r.TENSORFUSIONCONNECTIONS)
        # informer indexes are given the raw object: each is read through the view
        self.connections.add_index(CONNECTION_WORKLOAD_INDEX, lambda conn: connection_workload(Body(conn)))
        self.connections.add_index(CONNECTION_WORKER_INDEX, lambda conn: connection_worker(Body(conn)))
        self.pods = runtime.informer(r.PODS)
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.pools = runtime.informer(r.GPUPOOLS)
        self.providers = runtime.informer(r.PROVIDERCONFIGS)
        self.controller = runtime.manager.controller("tensorfusionconnection") \
            .for_(r.TENSORFUSIONCONNECTIONS) \
            .watches(r.PODS, lambda pod: self._keys_of_worker(Pod(pod)),
                     label_selector=component_selector(runtime.settings)) \
            .watches(r.TENSORFUSIONWORKLOADS, lambda workload: self._keys_of_workload(Body(workload))) \
            .watches(r.GPUPOOLS, lambda pool: self._keys_of_pool(Body(pool)), predicates=[generation_changed]) \
            .with_workers(4).complete(self)
        self.created = 0  # dedicated workers created (tests read it)
        #: connection key -> "namespace/worker" it was given, before the cache shows it: what
        #: least-connections counts, so two connections reconciled at once do not pick one worker
        self._serving: dict[str, str] = {}
        self._choosing = anyio.Lock()

    # --- triggers ---------------------------------------------------------------------------------

    def _connections(self, index: str, value: str) -> list[Body]:
        return [Body(c) for c in self.connections.by_index(index, value)]

    def _keys_of_worker(self, pod: Pod) -> list[str]:
        if not pod.is_worker or not len(self.connections):  # no connection (local mode only): nothing to wake
            return []
        namespace = pod.namespace
        keys = [f"{namespace}/{ref.get('name')}" for ref in pod.meta.owner_references
                if ref.get("controller") and ref.get("kind") == r.TENSORFUSIONCONNECTIONS.kind]
        keys += [_key(c) for c in self._connections(CONNECTION_WORKER_INDEX, _key(pod))]
        workload = pod.meta.label(tfa.WORKLOAD)
        if workload:
            keys += [_key(c) for c in self._connections(CONNECTION_WORKLOAD_INDEX, f"{namespace}/{workload}")
                     if not is_connected(c)]
        return list(dict.fromkeys(keys))

    def _keys_of_workload(self, workload: Body) -> list[str]:
        return [_key(c) for c in self._connections(CONNECTION_WORKLOAD_INDEX, _key(workload))]

    def _keys_of_pool(self, pool: Body) -> list[str]:
        """A pool's worker template is part of its dedicated workers' template hash."""
        keys: list[str] = []
        for workload_key in workloads_of_pool(self.workloads, pool.name):
            keys += [_key(c) for c in self._connections(CONNECTION_WORKLOAD_INDEX, workload_key)]
        return keys

    # --- the loop ---------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        cached = self.connections.get(key)
        conn = Body(cached) if cached is not None else None
        if conn is None or conn.meta.deleting:
            self._serving.pop(key, None)
            return None  # its dedicated worker goes with it (ownerReference)
        workload_name = text(conn.spec, "workloadName")
        found = self.workloads.get(f"{conn.namespace}/{workload_name}")
        if found is None:
            await self._lost_or_pending(conn, f"TensorFusionWorkload {workload_name} does not exist")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        workload = Workload(found)
        if is_dynamic(workload):
            return await self._dedicated(conn, workload)
        return await self._shared(conn, workload)

    async def _write(self, conn: Body, phase: str, worker: str, url: str) -> bool:
        """The whole status (all three fields, as the CRD requires), when it differs from the cache;
        whole, because a second write in one pass compares with a cache that has not seen the first."""
        wanted = {"phase": phase, "workerName": worker, "connectionURL": url}
        if {k: conn.status.get(k) for k in wanted} == wanted:
            return False
        try:
            await self.runtime.client.patch(r.TENSORFUSIONCONNECTIONS, conn.name, {"status": wanted},
                                            namespace=conn.namespace, subresource="status")
        except NotFound:
            return False
        return True

    async def _lost_or_pending(self, conn: Body, why: str) -> None:
        """No worker serves it now: Failed when one did (its URL no longer works), else Pending."""
        worker = text(conn.status, "workerName")
        self._serving.pop(_key(conn), None)
        if is_connected(conn) or conn.phase == FAILED:
            if await self._write(conn, FAILED, worker, ""):
                self.runtime.events.warning(conn, "WorkerLost", f"worker {conn.status.get('workerName')}: {why}")
            return
        await self._write(conn, PENDING, worker, "")

    async def _ready(self, conn: Body, worker: Pod) -> None:
        url = text(conn.status, "connectionURL")
        same = text(conn.status, "workerName") == worker.name and conn.phase == RUNNING
        if not (same and url and url_of_same_worker(url, worker)):
            url = connection_url(worker)
        self._serving[_key(conn)] = _key(worker)
        if await self._write(conn, RUNNING, worker.name, url):
            self.runtime.events.normal(conn, "ConnectionReady", f"worker {worker.name} serves at {url}")

    # --- dynamic workloads: a dedicated worker per connection -------------------------------------

    async def _dedicated(self, conn: Body, workload: Workload) -> Result | None:
        namespace, name = conn.namespace, conn.name
        found_pool = self.pools.get(workload.pool_name)
        pool = GpuPool(found_pool) if found_pool is not None else None
        wanted_hash = template_hash(pool, workload)
        cached = self.pods.get(f"{namespace}/{name}")
        pod = Pod(cached) if cached is not None else None
        if pod is not None and not controlled_by(pod, conn.uid):
            await self._lost_or_pending(conn, f"pod {name} exists and is not this connection's worker")
            self.runtime.events.warning(conn, "WorkerNameTaken", f"pod {namespace}/{name} exists and is not "
                                        f"controlled by this connection; delete it to get a worker")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        if pod is not None:
            outdated = pod.meta.label(tfa.POD_TEMPLATE_HASH) != wanted_hash
            if pod.meta.deleting or pod.finished or outdated:
                why = "is being deleted" if pod.meta.deleting else f"is {pod.phase}" if pod.finished else \
                    "runs an outdated template"
                await self._lost_or_pending(conn, why)
                if not pod.meta.deleting:
                    await self._delete(pod)
                return None  # the pod's deletion brings this connection back
            if serving(pod):
                await self._ready(conn, pod)
            else:
                await self._write(conn, PENDING, name, "")
            return None
        await self._lost_or_pending(conn, "is gone")
        return await self._create_dedicated(conn, workload, pool, wanted_hash)

    async def _create_dedicated(self, conn: Body, workload: Workload, pool: GpuPool | None,
                                wanted_hash: str) -> Result | None:
        namespace, name = conn.namespace, conn.name
        index = await self._index(f"{namespace}/{name}")
        try:
            pod = worker_pod(workload, pool, self.providers.list(), name=name, template=wanted_hash, dedicated=True,
                             owner=controller_reference(conn, r.TENSORFUSIONCONNECTIONS), index=index,
                             limiter_image=self.runtime.settings.limiter_image)
        except TemplateError as exc:
            self.runtime.events.warning(conn, "WorkerTemplateInvalid", str(exc))
            return Result(requeue_after=NO_WORKER_RETRY_S)
        try:
            await self.runtime.client.create(r.PODS, pod, namespace=namespace)
        except AlreadyExists:  # the old one is still on its way out
            return Result(requeue_after=1.0)
        self.created += 1
        self.runtime.events.normal(conn, "WorkerCreated", f"dedicated worker pod {name} created")
        await self._write(conn, PENDING, name, "")
        return None

    async def _index(self, key: str) -> int | None:
        """A pod index for the worker from the leader's index allocator (None when there is none)."""
        assignments = self.assignments
        if assignments.indexes is None:
            return None
        return assignments.indexes.assign(key)

    async def _delete(self, pod: Pod) -> None:
        try:
            await self.runtime.client.delete(r.PODS, pod.name, namespace=pod.namespace)
        except NotFound:
            pass

    # --- fixed workloads: one of the workload's workers -------------------------------------------

    async def _shared(self, conn: Body, workload: Workload) -> Result | None:
        namespace = conn.namespace
        workers = {p.name: p for p in (Pod(obj) for obj in self.pods.by_index(WORKLOAD_INDEX, _key(workload)))
                   if controlled_by(p, workload.uid)}
        current_hash = text(workload.status, "podTemplateHash")
        usable = {name: p for name, p in workers.items() if serving(p)
                  and (not current_hash or p.meta.label(tfa.POD_TEMPLATE_HASH) == current_hash)}
        current = usable.get(text(conn.status, "workerName")) if is_connected(conn) else None
        if current is not None:
            await self._ready(conn, current)
            return None
        if not usable:
            await self._lost_or_pending(conn, f"workload {workload.name} has no Running worker")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        if is_connected(conn):
            await self._lost_or_pending(conn, "no longer serves")
        async with self._choosing:
            key = _key(conn)
            chosen = min(usable.values(), key=lambda p: (self._load(f"{namespace}/{p.name}", key), p.name))
            await self._label_worker(conn, chosen.name)
            await self._ready(conn, chosen)
        self.runtime.events.normal(conn, "WorkerSelected", f"worker {chosen.name} selected")
        return None

    def _load(self, worker: str, conn_key: str) -> int:
        """Connections on `worker` ("namespace/name"), this one left out: those this reconciler
        gave it, and those the cache shows Running on it that it has not decided about."""
        keys = {key for key, serving in self._serving.items() if serving == worker}
        keys |= {key for c in self._connections(CONNECTION_WORKER_INDEX, worker)
                 if (key := _key(c)) not in self._serving}
        keys.discard(conn_key)
        return len(keys)

    async def _label_worker(self, conn: Body, worker: str) -> None:
        value = label_value(worker)
        if conn.meta.label(tfa.WORKER_NAME) == value:
            return
        try:
            await self.runtime.client.patch(r.TENSORFUSIONCONNECTIONS, conn.name,
                                            {"metadata": {"labels": {tfa.WORKER_NAME: value}}},
                                            namespace=conn.namespace)
        except NotFound:
            pass
