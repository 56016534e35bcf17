"""Device and worker usage: the original's `tf_gpu_usage` / `tf_worker_usage` tables and their gauges.

Why: the autoscaler and alert rules of the original read these tables, and Prometheus scrapes the
same facts from /metrics. Both come from the same samples (the device registry's last metrics and
process lists, the worker tracker's allocations); the points carry the real node, pool and workload:
a device's pool is its GPU object's `gpupool` label (Kubernetes backend; the `TENSOR_FUSION_POOL_NAME`
fallback until the pool is known), a worker's is its pod's `gpupool` annotation. Every
`--metrics-interval` `UsageRecorder` writes the points through a `MetricsOutput` (rotating file
and/or push, tfusion/metrics/sinks.py) in `TF_HYPERVISOR_METRICS_FORMAT`.

The limiter families (`LimiterCollector`) are read at scrape time from the soft workers' mapped
shared-memory files: the in-container limiter reports nothing itself, so its bucket and the
heartbeat it checks are the only view of whether a worker is throttled or frozen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import anyio
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tfusion.api import annotations as keys
from tfusion.api.accessors import Gpu
from tfusion.errors import RoleError
from tfusion.hypervisor.devices.registry import DeviceRegistry
from tfusion.hypervisor.limiter.soft import LIMITER_HEARTBEAT_GRACE_S, SYNC_INTERVAL_S, SoftIsolation
from tfusion.hypervisor.shm.state import ShmError
from tfusion.hypervisor.workers.model import WorkerInfo
from tfusion.hypervisor.workers.tracker import WorkerTracker
from tfusion.kube.resources import GPUS
from tfusion.metrics.points import Point
from tfusion.metrics.prometheus import HYPERVISOR_SPECS, PointsCollector
from tfusion.metrics.sinks import MetricsOutput, RotatingFile, push_config
from tfusion.metrics.tables import GPU_USAGE_TABLE, WORKER_USAGE_TABLE
from tfusion.settings import Settings

if TYPE_CHECKING:
    from tfusion.kube.manager import Manager

log = logging.getLogger(__name__)

PoolOf = Callable[[str], str]

#: compatibility for callers that still say Sample
Sample = Point


def _fixed(pool: str) -> PoolOf:
    return lambda _uuid: pool


def gpu_samples(registry: DeviceRegistry, node: str, pool_of: PoolOf, ts_ms: int = 0) -> list[Point]:
    metrics = registry.metrics()
    result = []
    for device in registry.devices():
        m = metrics.get(device.uuid)
        if m is None:
            continue
        result.append(Point(GPU_USAGE_TABLE, {"node": node, "pool": pool_of(device.uuid), "uuid": device.uuid}, {
            "compute_percentage": float(m.utilization_percent),
            "compute_tflops": float(m.utilization_percent) / 100 * device.max_tflops,
            "memory_bytes": int(m.memory_used_bytes),
            "memory_percentage": (m.memory_used_bytes / device.total_memory_bytes * 100
                                  if device.total_memory_bytes else 0.0),
            "power_usage": float(m.power_watts), "rx": int(m.pcie_rx_bytes),
            "temperature": float(m.temperature_celsius), "tx": int(m.pcie_tx_bytes)}, ts_ms))
    return result


def parse_extra_labels(text: str) -> dict[str, str]:
    """TF_HYPERVISOR_METRICS_EXTRA_LABELS: a JSON map of pod annotation key -> extra tag name (the
    direction the original's code uses)."""
    if not text.strip():
        return {}
    try:
        data = orjson.loads(text)
    except ValueError as exc:
        raise ValueError(f"TF_HYPERVISOR_METRICS_EXTRA_LABELS is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError("TF_HYPERVISOR_METRICS_EXTRA_LABELS must map annotation keys to tag names (strings)")
    return dict(data)


def worker_pool(worker: WorkerInfo, device_uuid: str, pool_of: PoolOf) -> str:
    """A worker's pool: its pod's gpupool annotation, else the pool of the device it runs on."""
    return worker.annotations.get(keys.GPU_POOL) or pool_of(device_uuid)


def worker_samples(registry: DeviceRegistry, workers: WorkerTracker, node: str, pool_of: PoolOf,
                   extra_labels: dict[str, str] | None = None, ts_ms: int = 0) -> list[Point]:
    allocations = {a.worker.uid: a for a in workers.allocations()}
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for proc in registry.processes():
        uid = workers.worker_for_pid(proc.pid)
        if uid is None or uid not in allocations:
            continue
        entry = sums.setdefault((uid, proc.device_uuid), {"memory_bytes": 0.0, "compute_percentage": 0.0})
        entry["memory_bytes"] += proc.used_memory_bytes
        entry["compute_percentage"] += proc.compute_percent
    result = []
    for uid, allocation in allocations.items():
        worker = allocation.worker
        for device in allocation.devices:
            used = sums.get((uid, device.uuid), {"memory_bytes": 0.0, "compute_percentage": 0.0})
            limit = worker.limits.vram_bytes
            pool = worker_pool(worker, device.uuid, pool_of)
            tags = {"namespace": worker.namespace, "node": node, "pod_name": worker.name, "pool": pool,
                    "uuid": device.uuid, "worker": uid, "workload": worker.workload_name or "unknown"}
            for annotation, tag in (extra_labels or {}).items():
                if annotation in worker.annotations and tag not in tags:
                    tags[tag] = worker.annotations[annotation]
            result.append(Point(WORKER_USAGE_TABLE, tags, {
                "compute_percentage": used["compute_percentage"],
                "compute_tflops": used["compute_percentage"] / 100 * device.max_tflops,
                "memory_bytes": int(used["memory_bytes"]),
                "memory_percentage": used["memory_bytes"] / limit * 100 if limit else 0.0}, ts_ms))
    return result


def device_pools(settings: Settings, manager: Manager | None, node: str) -> PoolOf:
    """uuid -> pool: the GPU object's `gpupool` label (Kubernetes backend), else the configured pool
    (TENSOR_FUSION_POOL_NAME; the local backend calls an unset one "local", as its workers do)."""
    if settings.backend == "local" or manager is None or not manager.has_client:
        return _fixed(settings.pool_name if settings.pool_name != "unknown" else "local")
    fallback = settings.pool_name
    # the same selector as the GPU reporter's informer, so both read one informer
    gpus = manager.cache.informer(GPUS, label_selector=f"{keys.MANAGED_BY}={node}")

    def pool_of(uuid: str) -> str:
        obj = gpus.get(uuid)
        return (Gpu(obj).meta.label(keys.GPU_POOL) if obj is not None else None) or fallback

    return pool_of


class UsageSource:
    """The current usage points of this node (what the file gets and what /metrics shows)."""

    def __init__(self, registry: DeviceRegistry, workers: WorkerTracker, *, node: str, pool_of: PoolOf,
                 extra_labels: dict[str, str] | None = None) -> None:
        self.registry = registry
        self.workers = workers
        self.node = node
        self.pool_of = pool_of
        self.extra_labels = extra_labels or {}

    def points(self, ts_ms: int = 0) -> list[Point]:
        return [*gpu_samples(self.registry, self.node, self.pool_of, ts_ms),
                *worker_samples(self.registry, self.workers, self.node, self.pool_of, self.extra_labels, ts_ms)]

    def device_families(self) -> Iterator[Metric]:
        """Facts about the devices themselves (not samples): size, FP16 TFLOPS, health."""
        labels = ["gpu", "node", "pool", "model"]
        total = GaugeMetricFamily("tfusion_gpu_memory_total_bytes", "GPU memory size", labels=labels)
        tflops = GaugeMetricFamily("tfusion_gpu_device_tflops", "FP16 TFLOPS the device reports", labels=labels)
        healthy = GaugeMetricFamily("tfusion_gpu_healthy", "1 when the GPU is healthy", labels=labels)
        for device in self.registry.devices():
            values = [device.uuid, self.node, self.pool_of(device.uuid), device.model]
            total.add_metric(values, device.total_memory_bytes)
            tflops.add_metric(values, device.max_tflops)
            healthy.add_metric(values, 1.0 if device.healthy else 0.0)
        yield from (total, tflops, healthy)


DEVICE_FAMILIES = {"tfusion_gpu_memory_total_bytes": "GPU memory size",
                   "tfusion_gpu_device_tflops": "FP16 TFLOPS the device reports",
                   "tfusion_gpu_healthy": "1 when the GPU is healthy"}


_LIMITER_LABELS = ["gpu", "node", "pool", "namespace", "pod", "workload"]  # as the tfusion_worker_* usage families
_LIMITER_GAUGES = {
    "tfusion_worker_limiter_tokens": "tokens in a soft worker's bucket on a GPU (each kernel launch takes at "
                                     "least one; the limiter makes launches wait while too few are left)",
    "tfusion_worker_limiter_capacity_tokens": "the most tokens a soft worker's bucket on a GPU holds",
    "tfusion_worker_limiter_refill_tokens_per_second": "tokens per second the hypervisor adds to a soft "
                                                       "worker's bucket on a GPU",
    "tfusion_worker_limiter_heartbeat_age_seconds": "age of the hypervisor heartbeat a soft worker's limiter "
                                                    "reads from its shared memory",
    "tfusion_worker_frozen": f"1 when a soft worker's launches on a GPU cannot proceed: the heartbeat is older "
                             f"than the limiter's default grace ({LIMITER_HEARTBEAT_GRACE_S} s), or the refill rate "
                             f"is 0 with less than one launch in the bucket",
}
_THROTTLED = ("tfusion_worker_throttled_seconds",
              f"seconds a soft worker's bucket on a GPU held less than one launch, sampled at each "
              f"shared-memory sync tick (every {SYNC_INTERVAL_S:g} s) before the refill")


class LimiterCollector(Collector):
    """The soft workers' limiter state (see the module docstring), one sample per (worker, device)."""

    def __init__(self, soft: SoftIsolation, *, node: str, pool_of: PoolOf) -> None:
        self.soft = soft
        self.node = node
        self.pool_of = pool_of

    @staticmethod
    def _families() -> tuple[dict[str, GaugeMetricFamily], CounterMetricFamily]:
        gauges = {name: GaugeMetricFamily(name, text, labels=_LIMITER_LABELS) for name, text in _LIMITER_GAUGES.items()}
        return gauges, CounterMetricFamily(*_THROTTLED, labels=_LIMITER_LABELS)

    def describe(self) -> Iterator[Metric]:
        gauges, throttled = self._families()
        yield from (*gauges.values(), throttled)

    def collect(self) -> Iterator[Metric]:
        gauges, throttled = self._families()
        try:
            views = self.soft.limiter_views()
        except ShmError as exc:  # a mapping closed under the scrape: report nothing rather than fail /metrics
            log.debug("limiter metrics skipped: %s", exc)
            views = []
        for view in views:
            worker = view.allocation.worker
            pool = worker_pool(worker, view.device.uuid, self.pool_of)
            labels = [view.device.uuid, self.node, pool, worker.namespace, worker.name,
                      worker.workload_name or "unknown"]
            for name, value in (("tfusion_worker_limiter_tokens", view.tokens),
                                ("tfusion_worker_limiter_capacity_tokens", view.capacity),
                                ("tfusion_worker_limiter_refill_tokens_per_second", view.refill_rate),
                                ("tfusion_worker_limiter_heartbeat_age_seconds", view.heartbeat_age_s),
                                ("tfusion_worker_frozen", 1.0 if view.frozen else 0.0)):
                gauges[name].add_metric(labels, value)
            throttled.add_metric(labels, view.throttled_s)
        yield from (*gauges.values(), throttled)


def register_usage_metrics(prom: CollectorRegistry, source: UsageSource, soft: SoftIsolation | None = None) -> None:
    """Add the per-device and per-worker gauges to the process's registry (the Manager's), and the
    soft workers' limiter families when soft isolation runs."""
    prom.register(PointsCollector(source.points, HYPERVISOR_SPECS, extra=source.device_families,
                                  extra_names=DEVICE_FAMILIES))
    if soft is not None:
        prom.register(LimiterCollector(soft, node=source.node, pool_of=source.pool_of))


class UsageRecorder:
    """Writes one block of usage points per interval through the role's `MetricsOutput`."""

    def __init__(self, source: UsageSource, output: MetricsOutput) -> None:
        self.source = source
        self.output = output

    async def record_once(self, ts_ms: int | None = None) -> int:
        points = self.source.points(int(time.time() * 1000) if ts_ms is None else ts_ms)
        await self.output.emit(points)
        return len(points)

    async def run(self, interval: float) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.output.run)
            while True:
                await anyio.sleep(interval)
                await self.source.registry.sample()
                await self.record_once()


def hypervisor_output(settings: Settings, prom: CollectorRegistry) -> MetricsOutput:
    path = settings.resolved_metrics_output_path
    try:
        push = push_config(settings)
    except ValueError as exc:  # raised inside the role's task group: a RoleError is reported as one line
        raise RoleError(f"hypervisor: {exc}") from None
    return MetricsOutput(role="hypervisor", registry=prom, file=RotatingFile(path) if path is not None else None,
                         push=push, fmt=settings.metrics_format)


def start_usage_metrics(settings: Settings, manager: Manager, registry: DeviceRegistry, workers: WorkerTracker,
                        node: str, extra_labels: dict[str, str], soft: SoftIsolation | None = None) -> UsageRecorder:
    """The hypervisor's metrics: gauges on the Manager's registry and the recorder (run it with
    `recorder.run(settings.metrics_interval)`)."""
    source = UsageSource(registry, workers, node=node, pool_of=device_pools(settings, manager, node),
                         extra_labels=extra_labels)
    register_usage_metrics(manager.registry, source, soft)
    return UsageRecorder(source, hypervisor_output(settings, manager.registry))
