"""Shared informers: one list+watch cache per (resource, namespace, selectors) per Manager.

An informer lists (paginated), then watches from the list's resourceVersion with bookmarks, a
server timeout and a read timeout, and reconnects with jittered backoff. When the server says
410 Gone it re-lists and reconciles its cache against the new list, emitting DELETED for objects
that vanished while it was disconnected, MODIFIED for those that changed and ADDED for new ones,
and nothing for the unchanged ones. Handlers each get their own unbounded queue and task, so a
slow handler never delays the watch or the other handlers. Indexes answer the hot lookups
(objects by namespace, by label value, by node) without scanning.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import logging
import random
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, Pod
from tfusion.api.documents import collector_paused, freeze_long_lived
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.selectors import EVERYTHING, parse_label_selector
from tfusion.kube.backoff import Backoff, Failures
from tfusion.kube.client import Gone, KubeClient, KubeError, WatchEvent, decode_event, object_key
from tfusion.kube.clock import REAL_CLOCK, Clock
from tfusion.kube.resources import ApiResource
from tfusion.kube.transforms import DEFAULT_TRANSFORM, Transform, pruned_decoder

log = logging.getLogger(__name__)

#: waits between reconnects after a failed list or watch: 0.2 s doubling to 30 s, jittered 50-150 %
#: around that (within those bounds) so many informers do not reconnect in step
RECONNECT_BACKOFF = Backoff(base=0.2, cap=30.0, jitter=0.5)

#: an index function gets a cached object as the server sent it (decoded JSON: what `get()` returns)
IndexFunc = Callable[[JsonMapping], Iterable[str]]
Callback = Callable[..., Awaitable[None] | None]


def _rv(obj: Body) -> str:
    return obj.meta.resource_version


# --- index functions --------------------------------------------------------------------------


#: the metadata a write may change besides resourceVersion, managedFields and generation
_TRACKED_METADATA = ("labels", "annotations", "ownerReferences", "finalizers", "deletionTimestamp")


def _beyond_status(old: Body, new: Body) -> bool:
    """Whether `new` differs from `old` in more than its status and write bookkeeping."""
    for field in old.raw.keys() | new.raw.keys():
        if field == "metadata":
            before, after = old.meta.raw, new.meta.raw
            if any(before.get(m) != after.get(m) for m in _TRACKED_METADATA):
                return True
        elif field != "status" and old.raw.get(field) != new.raw.get(field):
            return True
    return False


def namespace_index(obj: JsonMapping) -> list[str]:
    ns = Body(obj).namespace
    return [ns] if ns else []


def label_index(label: str) -> IndexFunc:
    def index(obj: JsonMapping) -> list[str]:
        value = Body(obj).meta.label(label)
        return [value] if value is not None else []

    return index


def node_name_index(obj: JsonMapping) -> list[str]:
    """The node an object lives on: a pod's spec.nodeName; a GPU's status.nodeSelector hostname
    or its managed-by label; a GPUNode's own name is its node."""
    node_name = Pod(obj).node_name or Gpu(obj).node_selector.get("kubernetes.io/hostname")
    if node_name:
        return [node_name]
    meta = Body(obj).meta
    managed_by = meta.label(tfa.MANAGED_BY)  # read now: it follows set_domain
    if managed_by:
        return [managed_by]
    if Body(obj).kind == "GPUNode" and meta.name:
        return [meta.name]
    return []


# --- metrics ----------------------------------------------------------------------------------


class InformerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter("tfusion_informer_events_total", "watch and relist events applied to the cache",
                              ["informer", "type"], registry=registry)
        self.relists = Counter("tfusion_informer_relists_total", "full lists (initial, and after 410 Gone)",
                               ["informer"], registry=registry)
        self.reconnects = Counter("tfusion_informer_watch_restarts_total", "watch streams re-opened",
                                  ["informer", "cause"], registry=registry)
        self.last_event_age = Gauge("tfusion_informer_last_event_age_seconds",
                                    "seconds since the last watch event or bookmark", ["informer"],
                                    registry=registry)
        self.objects = Gauge("tfusion_informer_objects", "objects in the cache", ["informer"],
                             registry=registry)
        self.synced = Gauge("tfusion_informer_synced", "1 once the initial list is in the cache",
                            ["informer"], registry=registry)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, InformerMetrics] = weakref.WeakKeyDictionary()


def _metrics_for(registry: CollectorRegistry | None) -> InformerMetrics:
    registry = registry if registry is not None else CollectorRegistry()
    found = _METRICS.get(registry)
    if found is None:
        found = _METRICS[registry] = InformerMetrics(registry)
    return found


# --- handlers ---------------------------------------------------------------------------------


#: the most queued events a handler takes in one pass
DELIVERY_BATCH = 64
#: cached objects from which a factory, once synced, freezes them (`_freeze_once_synced`)
FREEZE_AT = 10_000


@dataclass(slots=True)
class _Delivery:
    kind: str  # ADDED, MODIFIED, DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]


class Handler:
    """One subscriber: its own queue and task, so it cannot block the watch or other handlers.

    The queue is a deque and an Event rather than an anyio memory stream: a handler waits for
    nearly every event of a steady watch, and the stream's receive made a waiter object through
    `typing` each time (measured: 3 % of a leader's CPU scheduling new pods at full size)."""

    def __init__(self, on_add: Callback | None, on_update: Callback | None,
                 on_delete: Callback | None) -> None:
        self.on_add, self.on_update, self.on_delete = on_add, on_update, on_delete
        self._queue: deque[_Delivery] = deque()
        self._queued = anyio.Event()
        self.delivered = 0

    def push(self, delivery: _Delivery) -> None:
        self._queue.append(delivery)
        self._queued.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._queued = anyio.Event()
                await self._queued.wait()
                continue
            # what is queued already comes without a trip through the event loop for each
            # (an initial list queues 100,000 adds at once)
            for _ in range(min(len(queue), DELIVERY_BATCH)):
                delivery = queue.popleft()
                # nearly every handler is a plain function: calling it without a coroutine of
                # our own per delivery saves a few µs, times a dozen handlers per pod of a list
                result = self._call(delivery)
                if result is not None:
                    await self._finish(result, delivery)
                self.delivered += 1
            await anyio.sleep(0)

    def _call(self, delivery: _Delivery) -> Awaitable[object] | None:
        """Run the delivery's callback; what it returned when that is to be awaited."""
        args: tuple[dict[str, Any] | None, ...]
        if delivery.kind == "ADDED":
            callback, args = self.on_add, (delivery.new,)
        elif delivery.kind == "MODIFIED":
            callback, args = self.on_update, (delivery.old, delivery.new)
        else:
            callback, args = self.on_delete, (delivery.new,)
        if callback is None:
            return None
        try:
            result = callback(*args)
        except Exception:
            self._failed(callback, delivery)
            return None
        return result if result is not None and inspect.isawaitable(result) else None

    async def _finish(self, result: Awaitable[object], delivery: _Delivery) -> None:
        try:
            await result
        except Exception:
            self._failed(result, delivery)

    @staticmethod
    def _failed(what: object, delivery: _Delivery) -> None:
        log.exception("informer handler %r failed on %s %s", what, delivery.kind, object_key(delivery.new))


# --- the informer -----------------------------------------------------------------------------


@dataclass(frozen=True)
class InformerKey:
    resource: ApiResource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def describe(self) -> str:
        parts = [self.resource.name]
        if self.namespace:
            parts.append(f"ns={self.namespace}")
        if self.label_selector:
            parts.append(f"labels={self.label_selector}")
        if self.field_selector:
            parts.append(f"fields={self.field_selector}")
        return " ".join(parts)


class Informer:
    """A list+watch cache of one resource (see the module docstring). Run it with `run()`.

    Cached objects are the server's JSON, shared by every reader and handler: never modify them
    (copy first). Handlers get `on_add(obj)`, `on_update(old, new)`, `on_delete(last_known)`,
    plain or async; an object deleted while disconnected is announced with its last known state."""

    def __init__(self, client: KubeClient, resource: ApiResource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 registry: CollectorRegistry | None = None, timeout_seconds: int = 290,
                 read_timeout: float | None = None, backoff_base: float = RECONNECT_BACKOFF.base,
                 backoff_cap: float = RECONNECT_BACKOFF.cap,
                 page_size: int = 500, clock: Clock = REAL_CLOCK,
                 transform: Transform = DEFAULT_TRANSFORM) -> None:
        self.clock = clock
        #: applied to every object before it is cached or handed to a handler (kube/transforms.py)
        self.transform = transform
        #: the informers of this resource in one factory (this one included): an object another
        #: of them already holds at the same resourceVersion, through the same transform, is shared
        #: rather than cached twice (the scheduler's informer on every pod and the controller's on
        #: its own pods hold the same objects)
        self.siblings: builtins.list[Informer] = [self]
        self.client = client
        self.key = InformerKey(resource, namespace, label_selector, field_selector)
        self.resource = resource
        self.name = self.key.describe()
        self.timeout_seconds = timeout_seconds
        self.read_timeout = read_timeout
        self.retry = Failures(Backoff(base=backoff_base, cap=backoff_cap, jitter=RECONNECT_BACKOFF.jitter))
        self.page_size = page_size
        self._store: dict[str, dict[str, Any]] = {}
        #: counts changes to the cached objects other than status writes (`_beyond_status`): a
        #: reader that derives something from their specs, labels and annotations keeps the
        #: generation it read and knows its result current while the counter has not moved
        self.generation = 0
        self._index_funcs: dict[str, IndexFunc] = {}
        self._indexes: dict[str, dict[str, set[str]]] = {}
        self._indexed_values: dict[str, dict[str, str | tuple[str, ...]]] = {}
        self._handlers: list[Handler] = []
        #: called with the error each time the list or watch fails (the stream broke, not a clean end)
        self.error_listeners: list[Callable[[KubeError], None]] = []
        #: the informer this one takes its objects from (`follow`); None: it lists and watches itself
        self.source: Informer | None = None
        self._selector = EVERYTHING
        self._followers: list[Informer] = []
        self._tg: TaskGroup | None = None
        self._rv: str | None = None
        self._synced = anyio.Event()
        self._last_event = clock.now()
        self._metrics = _metrics_for(registry)
        self._m_events = self._metrics.events
        self._m_restarts = self._metrics.reconnects
        self._label_metrics()
        self.add_index("namespace", namespace_index)

    def _label_metrics(self) -> None:
        metrics = self._metrics
        self._m_event_kinds: dict[str, Any] = {}
        self._m_relists = metrics.relists.labels(self.name)
        metrics.last_event_age.labels(self.name).set_function(lambda: self.clock.now() - self._last_event)
        metrics.objects.labels(self.name).set_function(lambda: len(self._store))
        metrics.synced.labels(self.name).set_function(lambda: 1.0 if self._synced.is_set() else 0.0)

    # --- reading --------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    @property
    def resource_version(self) -> str | None:
        return self.source.resource_version if self.source is not None else self._rv

    def get(self, key: str) -> dict[str, Any] | None:
        """By "namespace/name" (namespaced) or "name"."""
        return self._store.get(key)

    def list(self) -> list[dict[str, Any]]:
        return list(self._store.values())

    def keys(self) -> builtins.list[str]:
        return list(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def by_index(self, index: str, value: str) -> builtins.list[dict[str, Any]]:
        return [self._store[k] for k in self._keys_at(index, value)]

    def count_by_index(self, index: str, value: str) -> int:
        """How many objects `by_index` gives, without building its list (a reconciler that counts a
        Deployment's thousands of pods on each of their events would otherwise copy them each time)."""
        return len(self._keys_at(index, value))

    def _keys_at(self, index: str, value: str) -> Collection[str]:
        if index not in self._index_funcs:
            raise KeyError(f"informer {self.name} has no index {index!r}; it has {sorted(self._index_funcs)}")
        return self._indexes[index].get(value, ())

    def index_values(self, index: str) -> builtins.list[str]:
        return [v for v, keys in self._indexes[index].items() if keys]

    # --- configuring ----------------------------------------------------------------------------

    def add_index(self, name: str, func: IndexFunc) -> None:
        """Add (or replace) an index; existing objects are indexed at once."""
        self._index_funcs[name] = func
        self._indexes[name] = {}
        self._indexed_values[name] = {}
        for key in self._store:
            self._index_one(name, key)

    def add_label_index(self, label: str) -> str:
        name = f"label:{label}"
        self.add_index(name, label_index(label))
        return name

    def add_handler(self, *, on_add: Callback | None = None, on_update: Callback | None = None,
                    on_delete: Callback | None = None) -> Handler:
        """Subscribe. Objects already in the cache are delivered to it as adds first."""
        handler = Handler(on_add, on_update, on_delete)
        for obj in self._store.values():
            handler.push(_Delivery("ADDED", None, obj))
        self._handlers.append(handler)
        if self._tg is not None:
            self._tg.start_soon(handler.run)
        return handler

    # --- running --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; `task_status.started()` comes at once (use `wait_synced`)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for handler in self._handlers:
                tg.start_soon(handler.run)
            task_status.started()
            try:
                if self.source is None:
                    await self._list_and_watch()
                else:
                    await anyio.sleep_forever()  # the source calls `_offer` and `_withdraw`
            finally:
                self._tg = None

    # --- following another informer -------------------------------------------------------------

    def follow(self, source: Informer) -> None:
        """Take this informer's objects from `source`, an informer of the same resource and
        namespace with no selector, instead of a list and a watch of its own: it keeps those that
        match its label selector. The API server sends and this process decodes each object once
        for both (the controller's informer on its own pods and the scheduler's on every pod:
        100,000 pods listed once, not twice). An object whose labels stop matching is delivered as
        deleted, one whose labels start matching as added, as a selected watch would."""
        self.source = source
        self._selector = parse_label_selector(self.key.label_selector)
        source._followers.append(self)
        for key, obj in source._store.items():
            self._offer(key, obj)
        if source.synced:
            self._synced.set()

    def _offer(self, key: str, obj: dict[str, Any]) -> None:
        """The source cached `obj` under `key`."""
        self._last_event = self.clock.now()
        old = self._store.get(key)
        meta = obj.get("metadata")
        if self._selector.matches(meta.get("labels") if isinstance(meta, dict) else None):
            if old is not obj:
                self._put(key, obj)
                self._emit(_Delivery("ADDED" if old is None else "MODIFIED", old, obj), key)
        elif old is not None:
            self._delete(key)
            self._emit(_Delivery("DELETED", None, obj), key)

    def _withdraw(self, key: str, last: dict[str, Any]) -> None:
        """The source deleted `key`; `last` is its last known state."""
        self._last_event = self.clock.now()
        if key in self._store:
            self._delete(key)
            self._emit(_Delivery("DELETED", None, last), key)

    async def _list_and_watch(self) -> None:
        self.retry.reset()
        gone_in_a_row = 0
        while True:
            try:
                if self._rv is None:
                    if gone_in_a_row > 1:  # 410 again right after a re-list: do not spin
                        await self.clock.sleep(self.retry.fail())
                    await self._relist()
                opened = self.clock.now()
                got_events = await self._watch_once()
                self._m_restarts.labels(self.name, "closed").inc()
                if got_events or self.clock.now() - opened > 1.0:
                    self.retry.reset()
                    gone_in_a_row = 0
                    continue
                # the server closed an idle stream at once: do not hammer it
                await self.clock.sleep(self.retry.fail())
            except Gone as exc:
                log.info("informer %s: %s; re-listing", self.name, exc.message)
                self._m_restarts.labels(self.name, "gone").inc()
                self._rv = None
                gone_in_a_row += 1
            except KubeError as exc:
                self._m_restarts.labels(self.name, "error").inc()
                followers = [listener for follower in self._followers for listener in follower.error_listeners]
                for listener in [*self.error_listeners, *followers]:
                    listener(exc)
                delay = self.retry.fail()
                log.warning("informer %s: %s; retrying in %.1fs", self.name, exc, delay)
                await self.clock.sleep(delay)

    async def _watch_once(self) -> bool:
        got_events = False
        # like client-go: between 1x and 2x the minimum, so many informers do not reconnect at once
        timeout = int(self.timeout_seconds * (1.0 + random.random()))
        decoder = pruned_decoder(self.resource, self.transform)
        stream = self.client.watch(
            self.resource, namespace=self.key.namespace, label_selector=self.key.label_selector,
            field_selector=self.key.field_selector, resource_version=self._rv,
            timeout_seconds=timeout, read_timeout=self.read_timeout,
            decode=decode_event if decoder is None else decoder.event)
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                got_events = True
                self._apply(event, transformed=decoder is not None)
        return got_events

    async def _relist(self) -> None:
        """List page by page, each page transformed and applied before the next is fetched (a
        100,000-pod list never sits in memory whole); then drop what the list no longer has."""
        listed: set[str] = set()
        rv = ""
        # a kind whose items the decoder prunes while decoding comes out of it transformed already
        decoder = pruned_decoder(self.resource, self.transform)
        with collector_paused():
            pages = self.client.list_pages(self.resource, namespace=self.key.namespace,
                                           label_selector=self.key.label_selector,
                                           field_selector=self.key.field_selector, limit=self.page_size,
                                           decode=None if decoder is None else decoder.page)
            async with contextlib.aclosing(pages):
                async for page in pages:
                    self._apply_listed(page.items, listed, transformed=decoder is not None)
                    rv = page.resource_version
                    # transforming and indexing a page takes a while at that size: let the Lease
                    # renewals and the handlers run meanwhile (each object applied is a change on
                    # its own, as if it came by watch; the resourceVersion moves once all are in)
                    await anyio.sleep(0)
            if not self._synced.is_set() and len(self._store) >= FREEZE_AT:
                # a large first list is kept for the process's life: out of the collector's walks
                # before it is back on, or its first pass walks every object the list made
                freeze_long_lived(collect=False)
        self._m_relists.inc()
        self._last_event = self.clock.now()
        for key in [k for k in self._store if k not in listed]:
            gone = self._store[key]
            self._delete(key)
            self._emit(_Delivery("DELETED", None, gone), key)
        self._rv = rv
        if not self._synced.is_set():
            log.info("informer %s synced: %d objects at resourceVersion %s", self.name, len(self._store),
                     self._rv)
            self._synced.set()
            for follower in self._followers:
                log.info("informer %s synced: %d objects from %s", follower.name, len(follower), self.name)
                follower._synced.set()

    def _apply_listed(self, page: builtins.list[dict[str, Any]], listed: set[str], *, transformed: bool) -> None:
        """One page of a list into the cache (its items through the transform unless `transformed`);
        its keys into `listed`."""
        # kube leaves apiVersion/kind out of list items; cached objects carry them, as watch events do
        kind, api_version = self.resource.kind, self.resource.api_version
        for obj in page:
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            key = object_key(obj)
            listed.add(key)
            old = self._store.get(key)
            if old is not None and _rv(Body(old)) == _rv(Body(obj)):
                continue
            obj = self._transformed(key, obj, done=transformed)
            self._put(key, obj)
            self._emit(_Delivery("ADDED" if old is None else "MODIFIED", old, obj), key)

    def _apply(self, event: WatchEvent, *, transformed: bool = False) -> None:
        kind, obj = event
        self._last_event = self.clock.now()
        rv = _rv(Body(obj))
        if kind == "BOOKMARK":
            self._m_events.labels(self.name, kind).inc()
            if rv:
                self._rv = rv
            return
        key = object_key(obj)
        old = self._store.get(key)
        if kind in ("ADDED", "MODIFIED"):
            if old is not None and _rv(Body(old)) == rv:
                pass  # already have exactly this version
            else:
                obj = self._transformed(key, obj, done=transformed)
                self._put(key, obj)
                self._emit(_Delivery("ADDED" if old is None else "MODIFIED", old, obj), key)
        elif kind == "DELETED":
            if old is not None:
                self._delete(key)
                self._emit(_Delivery("DELETED", None, self._transformed(key, obj, done=transformed)), key)
        else:
            log.warning("informer %s: ignoring watch event of type %r", self.name, kind)
            return
        if rv:
            self._rv = rv

    def _emit(self, delivery: _Delivery, key: str) -> None:
        counter = self._m_event_kinds.get(delivery.kind)
        if counter is None:  # a child per kind, looked up once: a list of 100,000 counts each
            counter = self._m_event_kinds[delivery.kind] = self._m_events.labels(self.name, delivery.kind)
        counter.inc()
        for handler in self._handlers:
            handler.push(delivery)
        for follower in self._followers:
            if delivery.kind == "DELETED":
                follower._withdraw(key, delivery.new)
            else:
                follower._offer(key, delivery.new)

    # --- store and indexes ----------------------------------------------------------------------

    def _transformed(self, key: str, obj: dict[str, Any], *, done: bool = False) -> dict[str, Any]:
        """`obj` through this informer's transform (`done`: it has been already), or the copy a
        sibling already made of it."""
        rv = obj.get("metadata", {}).get("resourceVersion") if isinstance(obj.get("metadata"), dict) else None
        if rv:
            for sibling in self.siblings:
                if sibling is not self and sibling.transform is self.transform:
                    held = sibling._store.get(key)
                    if held is not None and held["metadata"].get("resourceVersion") == rv:
                        return held
        return obj if done else self.transform(obj)

    def _put(self, key: str, obj: dict[str, Any]) -> None:
        old = self._store.get(key)
        if old is None or _beyond_status(Body(old), Body(obj)):
            self.generation += 1
        self._store[key] = obj
        for name in self._index_funcs:
            self._index_one(name, key)

    def _delete(self, key: str) -> None:
        self.generation += 1
        self._store.pop(key, None)
        for name in self._index_funcs:
            self._unindex_one(name, key)

    def _index_one(self, name: str, key: str) -> None:
        """(Re)index the cached object at `key` under index `name`."""
        try:
            values = tuple(dict.fromkeys(self._index_funcs[name](self._store[key])))
        except Exception:
            log.exception("informer %s: index %s failed on %s", self.name, name, key)
            values = ()
        # one value (nearly always: a namespace, a node) is kept as itself, not as a 1-tuple: a
        # tuple per object per index is 56 bytes, several MB at 100,000 pods
        kept: str | tuple[str, ...] = values[0] if len(values) == 1 else values
        if self._indexed_values[name].get(key) == kept:
            return
        self._unindex_one(name, key)
        index = self._indexes[name]
        for value in values:
            index.setdefault(value, set()).add(key)
        self._indexed_values[name][key] = kept

    def _unindex_one(self, name: str, key: str) -> None:
        index = self._indexes[name]
        held = self._indexed_values[name].pop(key, ())
        for value in (held,) if isinstance(held, str) else held:
            keys = index.get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[value]


# --- the shared factory -----------------------------------------------------------------------


class InformerFactory:
    """A Manager's informer cache: one Informer per (resource, namespace, label selector, field
    selector), shared by every consumer that asks with exactly those.

    A consumer gets exactly the objects its selectors match, never more: two consumers that ask
    for one resource with different selectors get two informers (an object both match is cached
    twice; that is the price of each reading only what it declared). An ask after `run()` started
    gets its informer started at once."""

    def __init__(self, client: KubeClient, *, registry: CollectorRegistry | None = None,
                 **informer_options: Any) -> None:
        self.client = client
        self.registry = registry if registry is not None else CollectorRegistry()
        self.informer_options = informer_options
        self._informers: dict[InformerKey, Informer] = {}
        self._transforms: dict[ApiResource, Transform] = {}
        self._siblings: dict[ApiResource, list[Informer]] = {}
        self._tg: TaskGroup | None = None

    def informer(self, resource: ApiResource, *, namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None) -> Informer:
        key = InformerKey(resource, namespace, label_selector, field_selector)
        found = self._informers.get(key)
        if found is not None:  # not `or`: an empty Informer is falsy (it has a length)
            return found
        found = Informer(self.client, resource, namespace=namespace, label_selector=label_selector,
                         field_selector=field_selector, registry=self.registry,
                         transform=self._transforms.get(resource, DEFAULT_TRANSFORM), **self.informer_options)
        siblings = self._siblings.setdefault(resource, [])
        siblings.append(found)
        found.siblings = siblings
        self._informers[key] = found
        self._share_stream(found)
        if self._tg is not None:
            self._tg.start_soon(found.run)
        return found

    def _share_stream(self, new: Informer) -> None:
        """One list and watch per resource and namespace where one informer has no selector: an
        informer that selects by labels alone follows it (`Informer.follow`), whichever was asked
        for first, as long as the follower has not started listing by itself."""
        resource, namespace = new.key.resource, new.key.namespace
        whole = self._informers.get(InformerKey(resource, namespace))
        if whole is None:
            return
        for informer in self._siblings.get(resource, ()):
            key = informer.key
            if (informer is not whole and informer.source is None and informer._tg is None
                    and key.namespace == namespace and key.label_selector and not key.field_selector):
                informer.follow(whole)

    def set_transform(self, resource: ApiResource, transform: Transform) -> None:
        """What `resource`'s informers keep of each object (kube/transforms.py), theirs and any made
        later. Set it before the informers run: objects already cached are not transformed again."""
        self._transforms[resource] = transform
        for informer in self._siblings.get(resource, ()):
            informer.transform = transform

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    @property
    def synced(self) -> bool:
        return all(inf.synced for inf in self._informers.values())

    async def wait_synced(self) -> None:
        for informer in list(self._informers.values()):
            await informer.wait_synced()

    async def _freeze_once_synced(self) -> None:
        """A large cache, once listed, lives as long as the process: out of the cyclic collector's
        walks with it (documents.freeze_long_lived; measured at 100,000 pods: full collections of
        1-2 s, then none). Without a collection first: the lists ran with the collector paused
        and decoded JSON holds no cycles, so there is next to no cyclic garbage to free (measured
        at 100,000 pods: 25 objects, for a collection of 1.1 s of CPU on the event loop while the
        allocator recovers). A small cache is left alone: its collections are short."""
        await self.wait_synced()
        if sum(len(informer) for informer in self._informers.values()) >= FREEZE_AT:
            freeze_long_lived(collect=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for informer in self._informers.values():
                tg.start_soon(informer.run)
            tg.start_soon(self._freeze_once_synced)
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None
