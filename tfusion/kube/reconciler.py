"""One shape for every control loop: `reconcile(key) -> Result`, run by a `Controller`, wired by a builder.

Why: each reconciler of tfusion (allocator status, pools, nodes, workloads, …) must behave the same
way — level-triggered, one key at a time, retried with backoff, restartable across leadership
terms — and controller-runtime showed that the way to get that is to write the loop once:

- `Controller` runs N workers over a per-controller `WorkQueue`. An exception requeues the key
  with per-key exponential backoff and counts in `tfusion_reconcile_errors_total`; a 409 Conflict
  requeues it too (the next run re-reads the cache); `Result(requeue_after=s)` comes back after
  `s` seconds. Each `run()` starts a fresh queue, waits for its informers to sync and enqueues
  every object of its primary informer, so a controller cancelled when its replica stops leading
  works again — on the current state of the cluster — when it leads again. Events enqueue keys
  only from then on (`primed`): that start covers whatever came before.
- `ControllerBuilder` (`manager.controller(name)`) says what triggers a key: `for_(resource)` (the
  object's own key), `owns(resource)` (the key of the controlling owner in ownerReferences) and
  `watches(resource, map_fn)` (any keys the function returns), each with optional predicates on
  updates (e.g. `generation_changed`). `complete(reconciler)` registers the loop with the Manager.
- `ensure_finalizer` is the one finalizer protocol: add it on first sight; on deletion run the
  cleanup and remove it once the cleanup says it is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.kube.client import Conflict, KubeClient, NotFound, object_key
from tfusion.kube.clock import REAL_CLOCK, Clock
from tfusion.kube.informer import Informer
from tfusion.kube.pacing import Pacer
from tfusion.kube.resources import ApiResource
from tfusion.kube.transforms import PRUNED
from tfusion.kube.workqueue import Key, RateLimiter, ShutDown, WorkQueue, metrics_for

if TYPE_CHECKING:
    from tfusion.kube.manager import Manager

log = logging.getLogger(__name__)

#: decides whether an update (old, new) of a cached object (as the informer holds it: decoded
#: JSON) should trigger a reconcile; adds and deletes always do
Predicate = Callable[[JsonMapping, JsonMapping], bool]
#: the keys a cached object's change should enqueue
MapFunc = Callable[[JsonMapping], Iterable[Key]]
#: the view a finalizer's object is read through (and handed back as)
V = TypeVar("V", bound=Body)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for: nothing (done), `requeue` (with backoff), or `requeue_after` seconds."""

    requeue: bool = False
    requeue_after: float | None = None


class Reconciler(Protocol):
    async def reconcile(self, key: Any) -> Result | None: ...


Reconcile = Callable[[Any], Awaitable[Result | None]]


# --- predicates -------------------------------------------------------------------------------


def generation_changed(old: JsonMapping, new: JsonMapping) -> bool:
    """Spec changes only (the API server bumps metadata.generation on spec changes, not on status)."""
    return Body(old).meta.generation != Body(new).meta.generation


def spec_changed(old: JsonMapping, new: JsonMapping) -> bool:
    """For kinds without generation (pods, nodes): anything but status and resourceVersion changed."""
    before, after = Body(old), Body(new)
    return before.spec != after.spec or before.meta.labels != after.meta.labels \
        or before.meta.annotations != after.meta.annotations \
        or before.meta.deletion_timestamp != after.meta.deletion_timestamp


# --- the loop ---------------------------------------------------------------------------------


class Controller:
    """Workers calling `reconcile(key)` for keys from a `WorkQueue` (see the module docstring)."""

    def __init__(self, name: str, reconcile: Reconcile, *, workers: int = 1,
                 registry: CollectorRegistry | None = None, clock: Clock = REAL_CLOCK,
                 primary: Informer | None = None, sources: Sequence[Informer] = ()) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers}: expected at least 1")
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.clock = clock
        self.primary = primary
        self.sources = list(sources)
        self._registry = registry
        self.queue = self._new_queue()
        metrics = metrics_for(registry)
        self._duration = metrics.reconcile_time.labels(name)
        self._errors = metrics.errors.labels(name)
        self._results = {result: metrics.reconciles.labels(name, result)
                         for result in ("success", "error", "conflict", "requeue", "requeue_after")}
        self.running = False
        #: whether events enqueue keys. Until a run has queued every primary key (its start), an
        #: event's keys would be queued again by that start, or belong to no object it reconciles:
        #: a standby's, or a new leader's initial list of 100,000 pods, need not map each pod
        self.primed = primary is None

    def _new_queue(self) -> WorkQueue:
        return WorkQueue(self.name, rate_limiter=RateLimiter(clock=self.clock), registry=self._registry,
                         clock=self.clock)

    def enqueue(self, key: Key) -> None:
        self.queue.add(key)

    def enqueue_after(self, key: Key, delay: float) -> None:
        self.queue.add_after(key, delay)

    def watch(self, informer: Informer, key_of: MapFunc | None = None,
              predicates: Sequence[Predicate] = ()) -> None:
        """Enqueue keys for every add, delete, and (predicates allowing) update of `informer`."""
        keys_of = key_of or (lambda obj: (object_key(obj),))
        if informer not in self.sources:
            self.sources.append(informer)

        def on_change(obj: JsonMapping) -> None:
            if not self.primed:
                return
            for key in keys_of(obj):
                self.queue.add(key)

        def on_update(old: JsonMapping | None, new: JsonMapping) -> None:
            if not self.primed or (old is not None and not all(p(old, new) for p in predicates)):
                return
            keys = tuple(keys_of(new))  # a map may return a generator: read once
            for key in keys:
                self.queue.add(key)
            if old is not None:
                for key in set(keys_of(old)).difference(keys):  # e.g. an owner that changed
                    self.queue.add(key)

        informer.add_handler(on_add=on_change, on_update=on_update, on_delete=on_change)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Every run starts with a fresh queue holding every primary key."""
        if self.queue.shutting_down:
            self.queue = self._new_queue()
        self.running = True
        try:
            for informer in self.sources:
                await informer.wait_synced()
            if self.primary is not None:
                self.primed = True
                for key in self.primary.keys():  # noqa: SIM118 - an Informer, not a dict
                    self.queue.add(key)
            async with anyio.create_task_group() as tg:
                for _ in range(self.workers):
                    tg.start_soon(self._worker)
                task_status.started()
        finally:
            self.running = False
            self.primed = self.primary is None
            self.queue.shutdown()

    async def _worker(self) -> None:
        queue = self.queue
        # a backlog of reconciles that await nothing (100,000 pods at a term's start) would
        # otherwise run back to back: `get` does not wait while the queue has keys
        pacer = Pacer()
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            try:
                await self._process(queue, key)
            finally:
                queue.done(key)
            await pacer.turn()

    async def _process(self, queue: WorkQueue, key: Key) -> None:
        started = time.perf_counter()
        try:
            result = await self.reconcile(key)
        except Conflict:
            log.debug("%s: %s changed while being reconciled; requeued", self.name, key)
            self._results["conflict"].inc()
            queue.add_rate_limited(key)
            return
        except Exception:
            log.exception("%s: reconcile %s failed; retrying with backoff", self.name, key)
            self._results["error"].inc()
            self._errors.inc()
            queue.add_rate_limited(key)
            return
        finally:
            self._duration.observe(time.perf_counter() - started)
        if result is not None and result.requeue_after is not None:
            self._results["requeue_after"].inc()
            queue.forget(key)
            queue.add_after(key, result.requeue_after)
        elif result is not None and result.requeue:
            self._results["requeue"].inc()
            queue.add_rate_limited(key)
        else:
            self._results["success"].inc()
            queue.forget(key)


# --- the builder ------------------------------------------------------------------------------


def controller_owner_keys(owner: ApiResource) -> MapFunc:
    """Keys of the controlling owner of kind `owner.kind` named in an object's ownerReferences."""

    def keys(obj: JsonMapping) -> list[str]:
        meta = Body(obj).meta
        found = []
        for ref in meta.owner_references:
            if ref.get("kind") == owner.kind and ref.get("controller") and \
                    str(ref.get("apiVersion", "")).split("/")[0] == (owner.group or "v1"):
                name = str(ref.get("name", ""))
                found.append(f"{meta.namespace}/{name}" if owner.namespaced else name)
        return found

    return keys


class ControllerBuilder:
    """`manager.controller("gpu-status").for_(GPUS).owns(PODS).complete(reconciler)`."""

    def __init__(self, manager: Manager, name: str) -> None:
        self.manager = manager
        self.name = name
        self._primary: tuple[Informer, Sequence[Predicate]] | None = None
        self._primary_resource: ApiResource | None = None
        self._watches: list[tuple[Informer, MapFunc | None, Sequence[Predicate]]] = []
        self._workers = 1
        self._leader_only = True

    def for_(self, resource: ApiResource, *, predicates: Sequence[Predicate] = (),
             label_selector: str | None = None, field_selector: str | None = None) -> ControllerBuilder:
        if self._primary is not None:
            raise ValueError(f"controller {self.name}: for_() was already given")
        informer = self.manager.cache.informer(resource, label_selector=label_selector,
                                               field_selector=field_selector)
        self._primary, self._primary_resource = (informer, predicates), resource
        return self

    def owns(self, resource: ApiResource, *, predicates: Sequence[Predicate] = (),
             label_selector: str | None = None) -> ControllerBuilder:
        if self._primary_resource is None:
            raise ValueError(f"controller {self.name}: call for_() before owns()")
        informer = self.manager.cache.informer(resource, label_selector=label_selector)
        self._watches.append((informer, controller_owner_keys(self._primary_resource), predicates))
        return self

    def watches(self, resource: ApiResource, map_fn: MapFunc, *, predicates: Sequence[Predicate] = (),
                label_selector: str | None = None, field_selector: str | None = None) -> ControllerBuilder:
        informer = self.manager.cache.informer(resource, label_selector=label_selector,
                                               field_selector=field_selector)
        self._watches.append((informer, map_fn, predicates))
        return self

    def with_workers(self, workers: int) -> ControllerBuilder:
        self._workers = workers
        return self

    def on_every_replica(self) -> ControllerBuilder:
        """Run on every replica, not only on the leader (e.g. the simulated kubelet)."""
        self._leader_only = False
        return self

    def complete(self, reconciler: Reconciler | Reconcile) -> Controller:
        reconcile: Reconcile = reconciler.reconcile if hasattr(reconciler, "reconcile") else reconciler
        primary = self._primary[0] if self._primary else None
        controller = Controller(self.name, reconcile, workers=self._workers, registry=self.manager.registry,
                                clock=self.manager.clock, primary=primary)
        if self._primary is not None:
            controller.watch(self._primary[0], predicates=self._primary[1])
        for informer, map_fn, predicates in self._watches:
            controller.watch(informer, map_fn, predicates)
        self.manager.add(controller.run, name=f"controller {self.name}", leader_only=self._leader_only)
        return controller


# --- finalizers -------------------------------------------------------------------------------


async def ensure_finalizer(client: KubeClient, resource: ApiResource, obj: V, finalizer: str,
                           cleanup: Callable[[V], Awaitable[bool]]) -> V | None:
    """The finalizer protocol. Returns the object to go on reconciling (through the same view), or
    None when it is being deleted (the cleanup ran; the finalizer was removed once `cleanup`
    returned True, and the caller should requeue while it returns False). Writes are conditional on
    the read resourceVersion (`set_finalizers`): a concurrent change raises Conflict, which the
    Controller requeues."""
    meta = obj.meta
    finalizers = meta.finalizers
    if meta.deleting:
        if finalizer in finalizers and await cleanup(obj):
            finalizers.remove(finalizer)
            try:
                await set_finalizers(client, resource, obj, finalizers)
            except NotFound:
                pass
        return None
    if finalizer not in finalizers:
        obj = type(obj)(await set_finalizers(client, resource, obj, [*finalizers, finalizer]))
    return obj


async def set_finalizers(client: KubeClient, resource: ApiResource, obj: Body, finalizers: list[str]) -> dict[str, Any]:
    """Write `obj`'s finalizer list as `finalizers`, if the object is still at the version read.
    A kind whose cached objects lack fields (kube/transforms.py PRUNED) gets a merge patch of the
    list alone; any other is PUT back whole, the one verb the shipped RBAC grants on every kind."""
    meta = obj.meta
    namespace = meta.namespace or None
    if resource.kind in PRUNED:
        return await client.patch(resource, meta.name, {"metadata": {
            "finalizers": finalizers, "resourceVersion": meta.resource_version}}, namespace=namespace)
    return await client.replace(resource, {**obj.raw, "metadata": {**meta.raw, "finalizers": finalizers}},
                                namespace=namespace)
