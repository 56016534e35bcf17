"""The controller's metrics recorder: the original's six tables, every `--metrics-interval`, on the leader.

Why: users read allocation, usage and cost with SQL from GreptimeDB (`tf_worker_resources`,
`tf_node_metrics`, `tf_pool_metrics`, `tf_gpu_metrics`, `tf_gpu_allocation`, `tf_system_metrics`;
reference upstream-controller.md §10). Each tick reads the informer caches and the leader's
allocator (the per-worker rows paced, so that 100,000 workers do not hold the event loop for
seconds), writes the points through the role's `MetricsOutput` and keeps them for the Prometheus
collector (`tfusion/metrics/prometheus.py`). It lives in the
controller package because it reads the controller's runtime and allocator service; `metrics/`
holds what both roles use (points, sinks, families, cost).

A worker holding a hardware partition carries its template and slots and is billed for its slice
(metrics/partition.py).

Billing is exact: a worker is billed from when this leader first saw it live, for the time since its
last row, and a worker that goes (finished, deleted, vanished: the pod informer's events and the pod
reconciler's release hook say when) gets one last row billed up to that moment, then is forgotten.
A new leadership term starts billing afresh (the previous leader billed up to its last tick).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio

from tfusion.allocator import GpuAllocator, GpuInfo, RequestError, request_from_pod
from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body, Gpu, GpuPool, Pod, section
from tfusion.api.annotations import AnnotationError
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.autoscaler.recommender import Share, share_of
from tfusion.kube import resources as r
from tfusion.kube.pacing import paced
from tfusion.metrics import cost as billing
from tfusion.metrics.partition import GpuStatusLookup, PartitionHeld, partition_held, partition_share
from tfusion.metrics.points import Point
from tfusion.metrics.prometheus import Snapshot, register_controller_metrics
from tfusion.metrics.sinks import MetricsOutput, RotatingFile, push_config
from tfusion.metrics.tables import (
    ALLOCATION_TABLE,
    CONTROLLER_TABLES,
    GPU_TABLE,
    NODE_TABLE,
    POOL_TABLE,
    SYSTEM_TABLE,
    WORKER_TABLE,
)
from tfusion.settings import Settings

if TYPE_CHECKING:
    from tfusion.controller.allocation import AllocatorService
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

MILLI = 1000

TABLES = CONTROLLER_TABLES


def _quantity(value: object, *, milli: bool = False) -> int | None:
    if value in (None, ""):
        return None
    try:
        q = Quantity.parse(str(value))
    except QuantityError:
        return None
    return q.milli_value() if milli else q.value()


def _percent(part: float, whole: float) -> float:
    return part / whole * 100.0 if whole > 0 else 0.0


@dataclass(slots=True)
class WorkerRow:
    """What a worker's row says, refreshed from its pod and allocation while it lives."""

    uid: str
    namespace: str
    pod: str
    pool: str
    qos: str
    workload: str
    node: str
    gpus: tuple[str, ...]
    share: billing.WorkerShare
    ready: bool
    labels: dict[str, str] = field(default_factory=dict)
    protected_until: float | None = None  # wall seconds; eviction protection raises the price until then
    partition: PartitionHeld | None = None  # the hardware slice it holds (metrics/partition.py)


def _pod_ready(pod: Pod) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.conditions)


def _protected_until(pod: Pod) -> float | None:
    """The end of the pod's eviction protection in wall seconds (tfa.protection_end)."""
    return tfa.protection_end(pod.meta.annotations, pod.meta.creation_timestamp)


def is_billable(pod: Pod) -> bool:
    """A worker that holds GPUs (`Pod.holds_gpus`) and is not being deleted: billing stops at the
    delete, while the GPUs stay held until the controller's finalizer releases them."""
    return pod.holds_gpus and not pod.meta.deleting


def worker_row(pod: Pod, allocator: GpuAllocator | None,
               gpu_status: GpuStatusLookup | None = None) -> WorkerRow | None:
    """The row of a live worker pod; None when its annotations cannot be read. `gpu_status` (the GPU
    objects' status by name) tells which partition it holds, if any."""
    uid = pod.uid
    try:
        gpus = tfa.parse_gpu_ids(pod.meta.annotation(tfa.GPU_IDS) or "", key=tfa.GPU_IDS)
    except AnnotationError:
        return None
    info = _first_gpu(allocator, gpus)
    capacity = (info.capacity_tflops, info.capacity_vram) if info is not None else (0, 0)
    allocation = allocator.allocation(uid) if allocator is not None else None
    if allocation is not None:
        # the request the allocator parsed when it placed or recovered the pod: a leader's first
        # scan would otherwise parse 100,000 workers' annotations a second time
        req = allocation.request
    else:
        try:
            req = request_from_pod(pod, default_pool=info.pool if info is not None else None)
        except RequestError:
            return None
    if allocation is not None and allocation.charges:
        t_req, v_req = allocation.charges[0]
        t_lim, v_lim = allocation.limits[0] if allocation.limits else (0, 0)
    else:
        t_req, v_req = req.tflops_need(capacity[0]), req.vram_request
        t_lim, v_lim = req.tflops_limit_on(capacity[0]), req.vram_limit
    # a limit of 0 is "no limit": the worker may use the whole GPU
    t_lim, v_lim = t_lim or max(capacity[0], t_req), v_lim or max(capacity[1], v_req)
    share = billing.WorkerShare(tflops_request=t_req / MILLI, tflops_limit=t_lim / MILLI, vram_request=v_req,
                                vram_limit=v_lim, gpu_count=len(gpus) or req.count, qos=req.qos)
    partition = partition_held(pod, gpus, gpu_status) if gpu_status is not None else None
    if partition is not None:
        share = partition_share(share)
    return WorkerRow(uid=uid, namespace=req.namespace, pod=req.pod_name, pool=req.pool, qos=req.qos,
                     workload=req.workload[1], node=pod.node_name,
                     gpus=gpus, share=share, ready=_pod_ready(pod), labels=dict(pod.meta.labels),
                     protected_until=_protected_until(pod), partition=partition)


def _first_gpu(allocator: GpuAllocator | None, gpus: tuple[str, ...]) -> GpuInfo | None:
    """The allocator's view of the worker's first GPU (its pool and capacity); None when unknown."""
    if allocator is None or not gpus:
        return None
    try:
        return allocator.gpu_info(gpus[0])
    except KeyError:
        return None


@dataclass
class GpuView:
    name: str
    node: str
    pool: str
    model: str
    phase: str
    index: int | None
    capacity_tflops: int  # milli
    capacity_vram: int
    available_tflops: int
    available_vram: int

    @property
    def allocated_tflops(self) -> int:
        return max(0, self.capacity_tflops - self.available_tflops)

    @property
    def allocated_vram(self) -> int:
        return max(0, self.capacity_vram - self.available_vram)


def gpu_views(gpu_objects: Iterable[Gpu], allocator: GpuAllocator | None) -> dict[str, GpuView]:
    """Every reported GPU, with what is free from the allocator's ledger (the status when it has none)."""
    views: dict[str, GpuView] = {}
    for gpu in gpu_objects:
        name = gpu.name
        capacity = gpu.capacity
        cap_t, cap_v = _quantity(capacity.get("tflops"), milli=True), _quantity(capacity.get("vram"))
        if not name or cap_t is None or cap_v is None:
            continue
        labels = gpu.meta.labels
        available = gpu.available
        avail_t = _quantity(available.get("tflops"), milli=True)
        avail_v = _quantity(available.get("vram"))
        node = gpu.node_selector.get("kubernetes.io/hostname") or labels.get(tfa.MANAGED_BY) or ""
        if allocator is not None:
            try:
                avail_t, avail_v = allocator.available(name)
            except KeyError:
                pass
        index = gpu.status.get("index")
        views[name] = GpuView(name=name, node=node, pool=labels.get(tfa.GPU_POOL) or "",
                              model=gpu.gpu_model, phase=gpu.phase,
                              index=index if isinstance(index, int) and not isinstance(index, bool) else None,
                              capacity_tflops=cap_t, capacity_vram=cap_v,
                              available_tflops=cap_t if avail_t is None else avail_t,
                              available_vram=cap_v if avail_v is None else avail_v)
    return views


def _add_pod_label_tags(tags: dict[str, str], row: WorkerRow, extra_labels: Mapping[str, str]) -> None:
    """The dynamic config's metricsExtraPodLabels (pod label -> tag) on a row about one pod, as the
    original tags both tf_worker_resources and tf_gpu_allocation; a tag never replaces one of the table's own."""
    for label, tag in extra_labels.items():
        if label in row.labels and tag not in tags:
            tags[str(tag)] = row.labels[label]


def _virtual(obj: Body, total_t: int, total_v: int) -> tuple[int, int]:
    """(milli-TFLOPS, bytes) of virtual capacity from a GPUNode's or GPUPool's status; physical when unset."""
    virtual_t = _quantity(obj.status.get("virtualTFlops"), milli=True)
    virtual_v = _quantity(obj.status.get("virtualVRAM"))
    return (virtual_t or total_t, virtual_v or total_v)


class ControllerRecorder:
    """See the module docstring. `attach()` once, in `configure()`, after the reconcilers."""

    def __init__(self, runtime: ControllerRuntime, output: MetricsOutput, allocation: AllocatorService, *,
                 wall: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.allocation = allocation
        self.output = output
        self.wall = wall
        self.interval = runtime.settings.metrics_interval
        self.ledger = billing.BillingLedger()
        self.workers: dict[str, WorkerRow] = {}
        self.node_ledger = billing.BillingLedger()
        self.snapshot = Snapshot()
        self._worker_cost: dict[str, float] = {}
        self._node_cost: dict[str, float] = {}
        self._leading = False
        self.ticks = 0
        self._baking = anyio.Lock()

    # --- wiring ---------------------------------------------------------------------------------

    def attach(self) -> ControllerRecorder:
        rt = self.runtime
        rt.informer(r.PODS).add_handler(on_add=lambda raw: self._on_pod(Pod(raw)),
                                        on_update=lambda _old, new: self._on_pod(Pod(new)),
                                        on_delete=lambda raw: self._on_pod_delete(Pod(raw)))
        self.allocation.release_hooks.append(self._on_release)  # the one release of a worker is when it ended
        rt.add_leader_task(self.run_leader)
        rt.tasks.append(self.output.run)
        register_controller_metrics(rt.registry, lambda: self.snapshot, lambda: self.allocation.allocation_tally)
        return self

    async def run_leader(self) -> None:
        """Leader-only: bill afresh from this term's start, then record every interval."""
        service = self.allocation
        self._reset()
        try:
            if service is not None:
                await service.wait_ready(timeout=float("inf"))
            self._leading = True
            # the gauges right away (nothing is billed for a zero interval; the file waits for the first tick)
            await self.build(self.wall())
            while True:
                await self.runtime.manager.clock.sleep(self.interval)
                await self.record_once()
        finally:
            self._leading = False
            self._reset()

    def _reset(self) -> None:
        self.ledger.clear()
        self.node_ledger.clear()
        self.workers.clear()
        self._worker_cost.clear()
        self._node_cost.clear()
        self.snapshot = Snapshot()

    # --- when workers come and go ---------------------------------------------------------------

    def _allocator(self) -> GpuAllocator | None:
        service = self.allocation
        return service.allocator if service is not None else None

    def _track(self, pod: Pod, now: float) -> None:
        uid = pod.uid
        if not uid or self.ledger.is_ended(uid):
            return
        row = worker_row(pod, self._allocator(), self._gpu_status)
        if row is None:
            return
        self.ledger.seen(uid, now)
        self.workers[uid] = row

    def _recommended(self, row: WorkerRow, shares: dict[str, Share | None]) -> billing.WorkerShare | None:
        """The worker's share at its workload's recommendation (percent through its GPU's TFLOPS);
        `shares` holds this tick's parsed recommendations by workload."""
        key = f"{row.namespace}/{row.workload}"
        if key not in shares:
            raw = self.runtime.informer(r.TENSORFUSIONWORKLOADS).get(key)
            try:
                shares[key] = share_of(section(Body(raw).status, "recommendation"), "status.recommendation") \
                    if raw is not None else None
            except ValueError:
                shares[key] = None
        share = shares[key]
        if share is None:
            return None
        allocator, capacity = self._allocator(), 0
        if allocator is not None and row.gpus:
            try:
                capacity = allocator.gpu_info(row.gpus[0]).capacity_tflops
            except KeyError:
                pass
        t_req, t_lim = share.request.tflops_on(capacity), share.limit.tflops_on(capacity)
        return replace(row.share, tflops_request=t_req / MILLI, tflops_limit=t_lim / MILLI,
                       vram_request=share.request.vram, vram_limit=share.limit.vram)

    def _gpu_status(self, name: str) -> Mapping[str, Any] | None:
        gpu = self.runtime.informer(r.GPUS).get(name)
        return Gpu(gpu).status if gpu is not None else None

    def _end(self, uid: str, now: float) -> None:
        if uid:
            self.ledger.ended(uid, now)

    def _on_pod(self, pod: Pod) -> None:
        if not self._leading or not pod.is_worker:
            return
        if is_billable(pod):
            self._track(pod, self.wall())
        else:
            self._end(pod.uid, self.wall())

    def _on_pod_delete(self, pod: Pod) -> None:
        if self._leading:
            self._end(pod.uid, self.wall())

    async def _on_release(self, uid: str) -> None:
        if self._leading:
            self._end(uid, self.wall())

    async def _scan(self, now: float) -> None:
        """The informer's view: live workers tracked, tracked ones no longer live ended. A tracked
        row is refreshed by its pod's events (a bind, a resize and a partition each write the pod),
        not here, except a partition whose slots the GPU's status had not recorded yet. Paced
        (kube/pacing.py): the term's first scan makes a row for each of up to 100,000 workers; a
        worker that starts meanwhile is tracked by the pod handlers and is not among `known`."""
        known = self.ledger.uids()
        live = set()
        workers = self.workers
        async for pod in paced(map(Pod, self.runtime.informer(r.PODS).list())):
            if is_billable(pod):
                uid = pod.uid
                live.add(uid)
                row = workers.get(uid)
                if row is None or (row.partition is not None and row.partition.slot_start is None):
                    self._track(pod, now)
        for uid in known:
            if uid not in live:
                self.ledger.ended(uid, now)

    # --- the tick -------------------------------------------------------------------------------

    async def record_once(self, now: float | None = None) -> list[Point]:
        """Build and write one tick's points (`now`: wall seconds, default the current time)."""
        now = self.wall() if now is None else now
        config = self.runtime.dynamic_config.current
        self.output.fmt = str(config.get("metricsFormat") or "influx")
        self.output.set_ttl(str(config.get("metricsTTL") or ""))
        points = await self.build(now, extra_labels=dict(section(config, "metricsExtraPodLabels")))
        self.ticks += 1
        await self.output.emit(points)
        return points

    async def build(self, now: float, *, extra_labels: Mapping[str, str] | None = None) -> list[Point]:
        """Every table for this tick. The rows of the workers, a point or two each, are made paced
        (kube/pacing.py); a worker whose pod changes meanwhile is written as it is when its turn comes."""
        await self._scan(now)
        allocator = self._allocator()
        ts = int(now * 1000)
        rt = self.runtime
        gpus = gpu_views(map(Gpu, rt.informer(r.GPUS).list()), allocator)
        pools = {pool.name: pool for pool in map(GpuPool, rt.informer(r.GPUPOOLS).list())}
        pricing = self._pricing(pools)
        points = await self._worker_points(now, ts, pricing, extra_labels or {})
        points += self._node_points(now, ts, gpus)
        points += self._pool_points(ts, gpus, pools, allocator)
        points += self._gpu_points(ts, gpus)
        points += await self._allocation_points(ts, gpus, allocator, extra_labels or {})
        points += self._system_points(ts, pools)
        snapshot = Snapshot(points=points, worker_cost_total=self._worker_cost_labels(),
                            node_cost_total=self._node_cost_labels())
        self.snapshot = snapshot  # its families are made when first scraped (bake_for_scrape)
        for uid in [u for u in self.ledger.uids() if self.ledger.finished(u)]:
            self.ledger.forget(uid)
            self.workers.pop(uid, None)
            self._worker_cost.pop(uid, None)
        return points

    async def bake_for_scrape(self) -> None:
        """Make the last tick's Prometheus families, in a worker thread, when a scrape first asks
        for them rather than at every tick: at 100,000 workers that is seconds of CPU, which a
        controller nobody scrapes (its metrics read from the file or InfluxDB) no longer spends,
        and which a scrape every 15 s still pays once per tick. Returns with the current
        snapshot baked (a tick may replace it while an older one bakes)."""
        while (snapshot := self.snapshot).baked is None:
            async with self._baking:
                if snapshot.baked is None:
                    await anyio.to_thread.run_sync(snapshot.bake)

    def _pricing(self, pools: Mapping[str, GpuPool]) -> dict[str, billing.PoolPricing]:
        out: dict[str, billing.PoolPricing] = {}
        for name, pool in pools.items():
            try:
                out[name] = billing.pool_pricing(pool)
            except billing.PriceError as exc:
                log.warning("pool %s: cannot read its pricing (its workers cost 0): %s", name, exc)
        return out

    async def _worker_points(self, now: float, ts: int, pricing: Mapping[str, billing.PoolPricing],
                             extra_labels: Mapping[str, str]) -> list[Point]:
        points = []
        shares: dict[str, Share | None] = {}
        async for uid in paced(self.ledger.uids()):
            row = self.workers.get(uid)
            seconds = self.ledger.bill(uid, now)
            if row is None:
                continue
            protected = row.protected_until is not None and now < row.protected_until
            raw_cost = billing.worker_cost(row.share, pricing.get(row.pool), seconds, eviction_protected=protected)
            self._worker_cost[uid] = self._worker_cost.get(uid, 0.0) + raw_cost
            tags = {"namespace": row.namespace, "pool": row.pool, "qos": row.qos or "medium", "worker": row.pod,
                    "workload": row.workload}
            _add_pod_label_tags(tags, row, extra_labels)
            share = row.share
            after = self._recommended(row, shares)
            recommended = {} if after is None else {
                "tflops_recommended": after.tflops_request, "vram_bytes_recommended": after.vram_request,
                "raw_cost_recommended": billing.worker_cost(after, pricing.get(row.pool), seconds,
                                                            eviction_protected=protected)}
            points.append(Point(WORKER_TABLE, tags, {
                "gpu_count": share.gpu_count, "tflops_limit": share.tflops_limit,
                "tflops_request": share.tflops_request, "raw_cost": raw_cost,
                "vram_bytes_limit": share.vram_limit, "vram_bytes_request": share.vram_request,
                "ready": row.ready and not self.ledger.is_ended(uid),
                **(row.partition.fields() if row.partition is not None else {}), **recommended},
                ts, extra={"uid": uid}))
        return points

    def _node_points(self, now: float, ts: int, gpus: Mapping[str, GpuView]) -> list[Point]:
        prices = billing.hourly_prices(map(Body, self.runtime.informer(r.PROVIDERCONFIGS).list()))
        by_node: dict[str, list[GpuView]] = {}
        for gpu in gpus.values():
            by_node.setdefault(gpu.node, []).append(gpu)
        points = []
        nodes = [Body(n) for n in self.runtime.informer(r.GPUNODES).list()]
        names = {n.name for n in nodes}
        for gone in [n for n in self.node_ledger.uids() if n not in names]:
            self.node_ledger.forget(gone)
            self._node_cost.pop(gone, None)
        for node in nodes:
            name = node.name
            mine = by_node.get(name, [])
            self.node_ledger.seen(name, now)
            seconds = self.node_ledger.bill(name, now)
            raw_cost = billing.node_hourly_price(node, [g.model for g in mine], prices) * max(seconds, 0.0) / 3600
            self._node_cost[name] = self._node_cost.get(name, 0.0) + raw_cost
            total_t = sum(g.capacity_tflops for g in mine)
            total_v = sum(g.capacity_vram for g in mine)
            alloc_t = sum(g.allocated_tflops for g in mine)
            alloc_v = sum(g.allocated_vram for g in mine)
            virtual_t, virtual_v = _virtual(node, total_t, total_v)
            pool = node.meta.label(tfa.MANAGED_BY) or (mine[0].pool if mine else "")
            points.append(Point(NODE_TABLE, {"node": name, "pool": pool, "phase": node.phase}, {
                "allocated_tflops": alloc_t / MILLI, "allocated_tflops_percent": _percent(alloc_t, total_t),
                "allocated_tflops_percent_virtual": _percent(alloc_t, virtual_t),
                "allocated_vram_bytes": alloc_v, "allocated_vram_percent": _percent(alloc_v, total_v),
                "allocated_vram_percent_virtual": _percent(alloc_v, virtual_v),
                "gpu_count": len(mine), "raw_cost": raw_cost}, ts))
        return points

    def _pool_points(self, ts: int, gpus: Mapping[str, GpuView], pools: Mapping[str, GpuPool],
                     allocator: GpuAllocator | None) -> list[Point]:
        limited: dict[str, list[int]] = {}
        if allocator is not None:
            for gpu_names, limits in allocator.committed_limits():
                for gpu_name, (t, v) in zip(gpu_names, limits, strict=False):
                    gpu = gpus.get(gpu_name)
                    if gpu is not None:
                        entry = limited.setdefault(gpu.pool, [0, 0])
                        entry[0] += t or gpu.capacity_tflops
                        entry[1] += v or gpu.capacity_vram
        points = []
        for name, pool in sorted(pools.items()):
            mine = [g for g in gpus.values() if g.pool == name]
            total_t = sum(g.capacity_tflops for g in mine)
            total_v = sum(g.capacity_vram for g in mine)
            alloc_t = sum(g.allocated_tflops for g in mine)
            alloc_v = sum(g.allocated_vram for g in mine)
            virtual_t, virtual_v = _virtual(pool, total_t, total_v)
            if allocator is not None and not pool.status.get("virtualTFlops"):
                virtual_t = total_t * allocator.pool_config(name).tflops_oversell_ratio // 100 or total_t
            lim_t, lim_v = limited.get(name, [0, 0])
            points.append(Point(POOL_TABLE, {"pool": name, "phase": pool.phase}, {
                "allocated_tflops": alloc_t / MILLI, "allocated_tflops_percent": _percent(alloc_t, total_t),
                "allocated_tflops_percent_virtual": _percent(alloc_t, virtual_t),
                "allocated_vram_bytes": alloc_v, "allocated_vram_percent": _percent(alloc_v, total_v),
                "allocated_vram_percent_virtual": _percent(alloc_v, virtual_v),
                "limited_tflops": lim_t / MILLI, "limited_vram_bytes": lim_v,
                "limited_tflops_percent_virtual": _percent(lim_t, virtual_t),
                "limited_vram_percent_virtual": _percent(lim_v, virtual_v),
                "gpu_count": len(mine)}, ts))
        return points

    @staticmethod
    def _gpu_points(ts: int, gpus: Mapping[str, GpuView]) -> list[Point]:
        return [Point(GPU_TABLE, {"gpu": g.name, "node": g.node, "pool": g.pool, "gpu_model": g.model,
                                  "phase": g.phase}, {
            "capacity_tflops": g.capacity_tflops / MILLI, "capacity_vram_bytes": g.capacity_vram,
            "available_tflops": g.available_tflops / MILLI, "available_vram_bytes": g.available_vram,
            "allocated_tflops": g.allocated_tflops / MILLI, "allocated_vram_bytes": g.allocated_vram,
            "allocated_tflops_percent": _percent(g.allocated_tflops, g.capacity_tflops),
            "allocated_vram_percent": _percent(g.allocated_vram, g.capacity_vram)}, ts)
            for _, g in sorted(gpus.items())]

    async def _allocation_points(self, ts: int, gpus: Mapping[str, GpuView], allocator: GpuAllocator | None,
                                 extra_labels: Mapping[str, str]) -> list[Point]:
        points = []
        # each GPU's "model:index" once a tick, not once per worker on it (a fifth of a tick's CPU)
        labels = {name: f"{g.model}:{'' if g.index is None else g.index}" for name, g in gpus.items()}
        async for uid in paced(self.ledger.uids()):
            row = self.workers.get(uid)
            if row is None or self.ledger.is_ended(uid):
                continue
            if allocator is not None and not allocator.has_allocation(uid):
                continue
            model_index = ",".join(labels.get(g) or f":{g}" for g in row.gpus)
            tags = {"pod": row.pod, "namespace": row.namespace, "pod_uuid": uid, "node": row.node,
                    "gpu_model_index": model_index, "gpu_name": ",".join(row.gpus)}
            _add_pod_label_tags(tags, row, extra_labels)
            fields = {"gpu_count": len(row.gpus), **(row.partition.fields() if row.partition is not None else {})}
            points.append(Point(ALLOCATION_TABLE, tags, fields, ts))
        return points

    def _system_points(self, ts: int, pools: Mapping[str, GpuPool]) -> list[Point]:
        service = self.allocation
        tally = service.allocation_tally if service is not None else {}
        topo = service.topology_tally if service is not None else {}
        nodes: dict[str, int] = {}
        for node in map(Body, self.runtime.informer(r.GPUNODES).list()):
            pool = node.meta.label(tfa.MANAGED_BY) or ""
            nodes[pool] = nodes.get(pool, 0) + 1
        workers: dict[str, int] = {}
        for uid, row in self.workers.items():
            if not self.ledger.is_ended(uid):
                workers[row.pool] = workers.get(row.pool, 0) + 1
        return [Point(SYSTEM_TABLE, {"pool": name}, {
            "total_workers_cnt": workers.get(name, 0), "total_nodes_cnt": nodes.get(name, 0),
            "total_allocation_fail_cnt": tally.get((name, False), 0),
            "total_allocation_success_cnt": tally.get((name, True), 0),
            # tfusion has no autoscaler yet, and its topology search never degrades: these stay 0
            "total_scale_up_cnt": 0, "total_scale_down_cnt": 0,
            "total_topo_satisfied_cnt": topo.get((name, "satisfied"), 0),
            "total_topo_unsatisfied_cnt": topo.get((name, "unsatisfied"), 0),
            "total_topo_fallback_cnt": topo.get((name, "fallback"), 0), "total_topo_search_degraded_cnt": 0,
        }, ts) for name in sorted(pools)]

    def _worker_cost_labels(self) -> dict[tuple[str, str, str, str, str], float]:
        out: dict[tuple[str, str, str, str, str], float] = {}
        for uid, total in self._worker_cost.items():
            row = self.workers.get(uid)
            if row is not None:
                key = (row.namespace, row.pod, row.workload, row.pool, row.qos)
                out[key] = out.get(key, 0.0) + total
        return out

    def _node_cost_labels(self) -> dict[tuple[str, str], float]:
        pools = {}
        for node in map(Body, self.runtime.informer(r.GPUNODES).list()):
            pools[node.name] = node.meta.label(tfa.MANAGED_BY) or ""
        return {(name, pools.get(name, "")): total for name, total in self._node_cost.items()}


# --- settings -> transports ------------------------------------------------------------------------

def controller_output(settings: Settings, runtime: ControllerRuntime) -> MetricsOutput:
    path = settings.resolved_metrics_path
    # the original's default (/logs, a volume its chart mounts) is used only where it exists
    create = bool(settings.metrics_path) or "all" in settings.roles
    file = RotatingFile(path, create_parent=create) if path is not None else None
    return MetricsOutput(role="controller", registry=runtime.registry, file=file, push=push_config(settings),
                         fmt=str(runtime.dynamic_config.current.get("metricsFormat") or "influx"))


def attach_metrics(runtime: ControllerRuntime, allocation: AllocatorService) -> ControllerRecorder:
    """Attach the recorder (in `configure()`: it hooks the allocator service's releases)."""
    return ControllerRecorder(runtime, controller_output(runtime.settings, runtime), allocation).attach()
