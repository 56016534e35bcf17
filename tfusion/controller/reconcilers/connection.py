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
from tfusion.controller.reconcilers.common import (
    FAILED,
    PENDING,
    RUNNING,
    Obj,
    controlled_by,
    controller_reference,
    deleting,
    labels_of,
    meta,
    name_of,
    status_of,
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
from tfusion.kube.reconciler import Result, generation_changed

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime
    from tfusion.controller.scheduling.assignments import Assignments

log = logging.getLogger(__name__)

NO_WORKER_RETRY_S = 6.0
CONNECTION_WORKLOAD_INDEX = "connection:workload"
CONNECTION_WORKER_INDEX = "connection:worker"
FINISHED = ("Succeeded", "Failed")


def connection_workload(conn: Obj) -> list[str]:
    """"namespace/workload" of a connection."""
    name = (conn.get("spec") or {}).get("workloadName")
    return [f"{meta(conn).get('namespace')}/{name}"] if name else []


def connection_worker(conn: Obj) -> list[str]:
    """"namespace/worker" of a connection that a worker serves now (its Running status)."""
    status = status_of(conn)
    if status.get("phase") != RUNNING or not status.get("workerName"):
        return []
    return [f"{meta(conn).get('namespace')}/{status['workerName']}"]


def is_connected(conn: Obj) -> bool:
    status = status_of(conn)
    return status.get("phase") == RUNNING and bool(status.get("connectionURL"))


class ConnectionReconciler:
    """See the module docstring. Key: "namespace/name"."""

    def __init__(self, runtime: ControllerRuntime, assignments: Assignments) -> None:
        self.runtime = runtime
        self.assignments = assignments
        self.connections = runtime.informer(r.TENSORFUSIONCONNECTIONS)
        self.connections.add_index(CONNECTION_WORKLOAD_INDEX, connection_workload)
        self.connections.add_index(CONNECTION_WORKER_INDEX, connection_worker)
        self.pods = runtime.informer(r.PODS)
        self.workloads = runtime.informer(r.TENSORFUSIONWORKLOADS)
        self.pools = runtime.informer(r.GPUPOOLS)
        self.providers = runtime.informer(r.PROVIDERCONFIGS)
        self.controller = runtime.manager.controller("tensorfusionconnection") \
            .for_(r.TENSORFUSIONCONNECTIONS) \
            .watches(r.PODS, self._keys_of_worker, label_selector=component_selector(runtime.settings)) \
            .watches(r.TENSORFUSIONWORKLOADS, self._keys_of_workload) \
            .watches(r.GPUPOOLS, self._keys_of_pool, predicates=[generation_changed]) \
            .with_workers(4).complete(self)
        self.created = 0  # dedicated workers created (tests read it)
        #: connection key -> "namespace/worker" it was given, before the cache shows it: what
        #: least-connections counts, so two connections reconciled at once do not pick one worker
        self._serving: dict[str, str] = {}
        self._choosing = anyio.Lock()

    # --- triggers ---------------------------------------------------------------------------------

    def _keys_of_worker(self, pod: Obj) -> list[str]:
        if labels_of(pod).get(tfa.COMPONENT) != tfa.COMPONENT_WORKER:
            return []
        namespace = meta(pod).get("namespace")
        keys = [f"{namespace}/{ref.get('name')}" for ref in meta(pod).get("ownerReferences") or []
                if ref.get("controller") and ref.get("kind") == r.TENSORFUSIONCONNECTIONS.kind]
        keys += [f"{namespace}/{name_of(c)}"
                 for c in self.connections.by_index(CONNECTION_WORKER_INDEX, f"{namespace}/{name_of(pod)}")]
        workload = labels_of(pod).get(tfa.WORKLOAD)
        if workload:
            keys += [f"{namespace}/{name_of(c)}"
                     for c in self.connections.by_index(CONNECTION_WORKLOAD_INDEX, f"{namespace}/{workload}")
                     if not is_connected(c)]
        return list(dict.fromkeys(keys))

    def _keys_of_workload(self, workload: Obj) -> list[str]:
        namespace = meta(workload).get("namespace")
        return [f"{namespace}/{name_of(c)}" for c in
                self.connections.by_index(CONNECTION_WORKLOAD_INDEX, f"{namespace}/{name_of(workload)}")]

    def _keys_of_pool(self, pool: Obj) -> list[str]:
        """A pool's worker template is part of its dedicated workers' template hash."""
        keys: list[str] = []
        for workload_key in workloads_of_pool(self.workloads, name_of(pool)):
            keys += [f"{meta(c).get('namespace')}/{name_of(c)}"
                     for c in self.connections.by_index(CONNECTION_WORKLOAD_INDEX, workload_key)]
        return keys

    # --- the loop ---------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        conn = self.connections.get(key)
        if conn is None or deleting(conn):
            self._serving.pop(key, None)
            return None  # its dedicated worker goes with it (ownerReference)
        namespace = str(meta(conn).get("namespace") or "")
        workload_name = str((conn.get("spec") or {}).get("workloadName") or "")
        workload = self.workloads.get(f"{namespace}/{workload_name}")
        if workload is None:
            await self._lost_or_pending(conn, f"TensorFusionWorkload {workload_name} does not exist")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        if is_dynamic(workload):
            return await self._dedicated(conn, workload)
        return await self._shared(conn, workload)

    async def _write(self, conn: Obj, phase: str, worker: str, url: str) -> bool:
        """The whole status (all three fields, as the CRD requires), when it differs from the cache;
        whole, because a second write in one pass compares with a cache that has not seen the first."""
        wanted = {"phase": phase, "workerName": worker, "connectionURL": url}
        if {k: status_of(conn).get(k) for k in wanted} == wanted:
            return False
        try:
            await self.runtime.client.patch(r.TENSORFUSIONCONNECTIONS, name_of(conn), {"status": wanted},
                                            namespace=meta(conn).get("namespace"), subresource="status")
        except NotFound:
            return False
        return True

    async def _lost_or_pending(self, conn: Obj, why: str) -> None:
        """No worker serves it now: Failed when one did (its URL no longer works), else Pending."""
        status = status_of(conn)
        self._serving.pop(f"{meta(conn).get('namespace')}/{name_of(conn)}", None)
        if is_connected(conn) or status.get("phase") == FAILED:
            if await self._write(conn, FAILED, str(status.get("workerName") or ""), ""):
                self.runtime.events.warning(conn, "WorkerLost", f"worker {status.get('workerName')}: {why}")
            return
        await self._write(conn, PENDING, str(status.get("workerName") or ""), "")

    async def _ready(self, conn: Obj, worker: Obj) -> None:
        status = status_of(conn)
        url = str(status.get("connectionURL") or "")
        same = status.get("workerName") == name_of(worker) and status.get("phase") == RUNNING
        if not (same and url and url_of_same_worker(url, worker)):
            url = connection_url(worker)
        namespace = meta(conn).get("namespace")
        self._serving[f"{namespace}/{name_of(conn)}"] = f"{namespace}/{name_of(worker)}"
        if await self._write(conn, RUNNING, name_of(worker), url):
            self.runtime.events.normal(conn, "ConnectionReady", f"worker {name_of(worker)} serves at {url}")

    # --- dynamic workloads: a dedicated worker per connection -------------------------------------

    async def _dedicated(self, conn: Obj, workload: Obj) -> Result | None:
        namespace, name = str(meta(conn).get("namespace")), name_of(conn)
        pool = self.pools.get(str((workload.get("spec") or {}).get("poolName") or ""))
        wanted_hash = template_hash(pool, workload)
        pod = self.pods.get(f"{namespace}/{name}")
        if pod is not None and not controlled_by(pod, conn):
            await self._lost_or_pending(conn, f"pod {name} exists and is not this connection's worker")
            self.runtime.events.warning(conn, "WorkerNameTaken", f"pod {namespace}/{name} exists and is not "
                                        f"controlled by this connection; delete it to get a worker")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        if pod is not None:
            phase = status_of(pod).get("phase")
            outdated = labels_of(pod).get(tfa.POD_TEMPLATE_HASH) != wanted_hash
            if deleting(pod) or phase in FINISHED or outdated:
                why = "is being deleted" if deleting(pod) else f"is {phase}" if phase in FINISHED else \
                    "runs an outdated template"
                await self._lost_or_pending(conn, why)
                if not deleting(pod):
                    await self._delete(pod)
                return None  # the pod's deletion brings this connection back
            if serving(pod):
                await self._ready(conn, pod)
            else:
                await self._write(conn, PENDING, name, "")
            return None
        await self._lost_or_pending(conn, "is gone")
        return await self._create_dedicated(conn, workload, pool, wanted_hash)

    async def _create_dedicated(self, conn: Obj, workload: Obj, pool: Obj | None, wanted_hash: str) -> Result | None:
        namespace, name = str(meta(conn).get("namespace")), name_of(conn)
        index = await self._index(f"{namespace}/{name}")
        try:
            pod = worker_pod(workload, pool, self.providers.list(), name=name, template=wanted_hash, dedicated=True,
                             owner=controller_reference(conn, r.TENSORFUSIONCONNECTIONS), index=index)
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

    async def _delete(self, pod: Obj) -> None:
        try:
            await self.runtime.client.delete(r.PODS, name_of(pod), namespace=meta(pod).get("namespace"))
        except NotFound:
            pass

    # --- fixed workloads: one of the workload's workers -------------------------------------------

    async def _shared(self, conn: Obj, workload: Obj) -> Result | None:
        namespace = str(meta(conn).get("namespace"))
        workers = {name_of(p): p for p in self.pods.by_index(WORKLOAD_INDEX, f"{namespace}/{name_of(workload)}")
                   if controlled_by(p, workload)}
        current_hash = status_of(workload).get("podTemplateHash")
        usable = {name: p for name, p in workers.items() if serving(p)
                  and (not current_hash or labels_of(p).get(tfa.POD_TEMPLATE_HASH) == current_hash)}
        status = status_of(conn)
        current = usable.get(str(status.get("workerName") or "")) if is_connected(conn) else None
        if current is not None:
            await self._ready(conn, current)
            return None
        if not usable:
            await self._lost_or_pending(conn, f"workload {name_of(workload)} has no Running worker")
            return Result(requeue_after=NO_WORKER_RETRY_S)
        if is_connected(conn):
            await self._lost_or_pending(conn, "no longer serves")
        async with self._choosing:
            key = f"{namespace}/{name_of(conn)}"
            chosen = min(usable.values(), key=lambda p: (self._load(f"{namespace}/{name_of(p)}", key), name_of(p)))
            await self._label_worker(conn, name_of(chosen))
            await self._ready(conn, chosen)
        self.runtime.events.normal(conn, "WorkerSelected", f"worker {name_of(chosen)} selected")
        return None

    def _load(self, worker: str, conn_key: str) -> int:
        """Connections on `worker` ("namespace/name"), this one left out: those this reconciler
        gave it, and those the cache shows Running on it that it has not decided about."""
        keys = {key for key, serving in self._serving.items() if serving == worker}
        keys |= {key for c in self.connections.by_index(CONNECTION_WORKER_INDEX, worker)
                 if (key := f"{meta(c).get('namespace')}/{name_of(c)}") not in self._serving}
        keys.discard(conn_key)
        return len(keys)

    async def _label_worker(self, conn: Obj, worker: str) -> None:
        value = label_value(worker)
        if labels_of(conn).get(tfa.WORKER_NAME) == value:
            return
        try:
            await self.runtime.client.patch(r.TENSORFUSIONCONNECTIONS, name_of(conn),
                                            {"metadata": {"labels": {tfa.WORKER_NAME: value}}},
                                            namespace=meta(conn).get("namespace"))
        except NotFound:
            pass
